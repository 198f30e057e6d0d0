"""gpuadmin: run an NVIDIA GPU fleet."""

# The Celery app must be loaded whenever Django is, so @shared_task binds to it.
from gpuadmin.celery import app as celery_app

__all__ = ("celery_app",)
__version__ = "0.1.0"
