"""The WSGI entry point leaves what start-up built out of the garbage collector's passes."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings


def test_the_entry_point_imports_every_view_and_freezes_start_up():
    code = (
        "import gc, sys\n"
        "from gpuadmin.wsgi import application\n"
        "print(gc.get_freeze_count(), len(gc.get_objects()), sys.argv[1] in sys.modules)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpuadmin.settings"}
    found = subprocess.run(
        [sys.executable, "-c", code, settings.ROOT_URLCONF],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    frozen, tracked, views_imported = int(found[0]), int(found[1]), found[2]
    assert views_imported == "True"
    assert frozen > 50_000  # Django, DRF, every app and view
    assert tracked < frozen / 10  # what the collector still walks
