"""The one shape of a service's refusal of bad input: what is at fault (``field``) and why.

Services raise a subclass (``JobRejected``, ``QuotaInvalid``, ``RelayoutRefused`` ...); the
API's exception handler answers every one as a 400 naming the field (``gpuadmin.api``), and
forms show it on that field."""

from __future__ import annotations


class FieldRefusal(ValueError):
    """Input a service refuses: ``field`` names it, ``message`` says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
