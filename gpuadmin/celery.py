"""The Celery application: configured from Django settings (namespace ``CELERY``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

app = Celery("gpuadmin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
