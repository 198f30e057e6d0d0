"""The Celery application: configured from Django settings (namespace ``CELERY``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

app = Celery("gpuadmin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Workers keep their database connections between tasks (DATABASE_CONN_MAX_AGE); tasks carry
# the request id of what sent them (the audit log's ``request_id``).
import gpuadmin.celery_db  # noqa: E402, F401
import gpuadmin.request_id  # noqa: E402, F401
