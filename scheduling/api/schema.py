"""OpenAPI post-processing for the scheduling API (drf-spectacular's POSTPROCESSING_HOOKS)."""

from __future__ import annotations

from typing import Any


def submissions_any_of(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """A submission is answered with a job, a minimal job (``Prefer: return=minimal``) or an
    array. A whole job is a valid minimal one too, so the answer is ``anyOf`` these, not the
    ``oneOf`` drf-spectacular writes for a polymorphic answer (which every whole job breaks)."""
    schema = result.get("components", {}).get("schemas", {}).get("Submitted")
    if schema is not None and "oneOf" in schema:
        schema["anyOf"] = schema.pop("oneOf")
    return result
