"""WSGI entry point for granian (``gpuadmin serve``)."""

import gc
import os
from importlib import import_module

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

application = get_wsgi_application()
# Every view is imported now, not on the first request. Then what start-up built (some
# 140,000 objects) is frozen out of the collector's full passes, each of which walked it all:
# in a worker taking submissions, a 70-100 ms pause every few thousand requests, 1-3 ms frozen.
import_module(settings.ROOT_URLCONF)
gc.collect()
gc.freeze()
