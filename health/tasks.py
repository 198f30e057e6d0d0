"""Celery tasks of the health app: thin wrappers around its services.

Agents send ``health.report`` (signed, believed only from the node it is about); beat runs
the periodic ones on the central worker.
"""

from __future__ import annotations
