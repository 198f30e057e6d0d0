"""gpuadmin: run an NVIDIA GPU fleet.

Importing the package loads nothing else, so that the CLI's API verbs start fast: the Celery app
is loaded with Django (``gpuadmin.admin_site.AdminConfig.ready``), so that ``@shared_task``
binds to it.
"""

__version__ = "0.1.0"
