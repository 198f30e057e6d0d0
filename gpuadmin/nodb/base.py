"""Django's dummy backend, saying why: a node agent has no database, so any query (or
transaction) it attempts is a bug, and raises at once instead of reaching for a server."""

from __future__ import annotations

from typing import Any, NoReturn

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.dummy import base as dummy


def refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise ImproperlyConfigured(
        "a node agent has no database (GPUADMIN_AGENT): it reports to the central worker "
        "through the broker; this code must run on the central side"
    )


class DatabaseOperations(dummy.DatabaseOperations):
    quote_name = refuse


class DatabaseWrapper(dummy.DatabaseWrapper):
    vendor = "none"
    display_name = "no database"
    _cursor = refuse
    ensure_connection = refuse
    _commit = refuse
    _savepoint_commit = refuse
    _set_autocommit = refuse
    ops_class = DatabaseOperations
