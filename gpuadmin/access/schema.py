"""OpenAPI description of the API token and basic authentications (``gpuadmin.access.tokens``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "gpuadmin.access.tokens.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return build_bearer_security_scheme_object(
            header_name="Authorization", token_prefix="Bearer"
        )


class BasicScheme(OpenApiAuthenticationExtension):
    target_class = "gpuadmin.access.tokens.BasicAuthentication"
    name = "basicAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "basic"}
