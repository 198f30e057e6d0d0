"""WSGI entry point for granian (``gpuadmin serve``)."""

import gc
import os
from importlib import import_module

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

application = get_wsgi_application()
# Every view is imported now, not on the first request. Then what start-up built is frozen
# out of the collector's full passes, each of which would walk it all again: a pause every few
# thousand requests in a worker taking submissions (docs/development/benchmarks.md).
import_module(settings.ROOT_URLCONF)
gc.collect()
gc.freeze()
