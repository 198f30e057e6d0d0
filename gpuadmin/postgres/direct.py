"""The connection for what needs a database session of its own: LISTEN (the gRPC streams'
state changes) is a session's, and stops hearing anything behind PgBouncer's transaction
pooling, which hands each transaction to any server connection."""

from __future__ import annotations

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


def direct_connection() -> BaseDatabaseWrapper:
    """A new connection (not the thread's) to ``DATABASE_DIRECT_URL``'s server, or to
    ``DATABASE_URL``'s when it is unset (no pooler, or one in session mode)."""
    direct = settings.DATABASE_DIRECT
    if direct is None:
        return connections.create_connection("default")
    default = connections["default"]
    options = {**default.settings_dict["OPTIONS"], **direct["OPTIONS"]}
    return type(default)({**default.settings_dict, **direct, "OPTIONS": options}, "default")
