"""Filters the ``LOGGING`` setting attaches to loggers (imported while logging is configured,
before the apps are loaded: no models here)."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied


def _escaped(text: str) -> str:
    """``text`` on one line, as Django escapes what it logs of a request."""
    return text.encode("unicode_escape").decode("ascii")


class RefusalOnOneLine(logging.Filter):
    """``django.request`` logs a page's 403 (a ``PermissionDenied``) with its traceback; a
    refusal is not a fault, so it becomes one line: who was refused which request, and why."""

    def filter(self, record: logging.LogRecord) -> bool:
        refused = record.exc_info[1] if record.exc_info else None
        request = getattr(record, "request", None)
        if not isinstance(refused, PermissionDenied) or request is None:
            return True
        user = getattr(request, "user", None)
        who = user.get_username() if user is not None and user.is_authenticated else "anonymous"
        record.msg = "Forbidden: %s %s by %s: %s"
        record.args = (
            request.method,
            _escaped(request.path),
            _escaped(who),
            _escaped(str(refused) or "permission denied"),
        )
        record.exc_info = record.exc_text = None
        return True
