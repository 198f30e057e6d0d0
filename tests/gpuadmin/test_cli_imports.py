"""The CLI's API verbs start fast (bench/cli_start.py times it) because ``gpuadmin.cli`` loads
none of the server's heavy parts: a module that drags one in fails here, not in the bench."""

from __future__ import annotations

import json
import subprocess
import sys

# Loaded only by the verbs that need them (server verbs, a drawn table), never at start.
HEAVY = ("celery", "django.db", "django.conf", "rest_framework", "rich", "scheduling.placement")


def test_the_cli_starts_without_the_servers_parts():
    script = "import gpuadmin.cli, json, sys; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout
    )
    assert [m for m in loaded if m.startswith(HEAVY)] == []
