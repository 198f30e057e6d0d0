"""OpenAPI post-processing for the scheduling API (drf-spectacular's POSTPROCESSING_HOOKS)."""

from __future__ import annotations

from typing import Any

#: The answers that are a whole job or a minimal one (``Prefer: return=minimal``): a
#: submission's (or an array), and a resend's (``Idempotency-Key``).
JOB_OR_MINIMAL = ("Submitted", "Resent")


def submissions_any_of(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """A submission is answered with a job, a minimal job (``Prefer: return=minimal``) or an
    array, and a resend with a job or a minimal one. A whole job is a valid minimal one too,
    so each answer is ``anyOf`` these, not the ``oneOf`` drf-spectacular writes for a
    polymorphic answer (which every whole job breaks)."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in JOB_OR_MINIMAL:
        schema = schemas.get(name)
        if schema is not None and "oneOf" in schema:
            schema["anyOf"] = schema.pop("oneOf")
    return result
