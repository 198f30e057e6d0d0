"""The Celery application: configured from Django settings (namespace ``CELERY``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

app = Celery("gpuadmin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Tasks carry the request id of what sent them (the audit log's ``request_id``).
import gpuadmin.request_id  # noqa: E402, F401
