"""How the OpenAPI document describes the bearer tokens (drf-spectacular extension)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class TokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.api.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer", "description": "An API token from /accounts/tokens/"}


class GateTokenScheme(OpenApiAuthenticationExtension):
    """The gate resource's variant: the same bearer token, or Flagger's ``metadata.token`` in a POST body."""

    target_class = "apps.api.gates.TokenInBodyAuthentication"
    name = "gateToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token; a POST may carry it as metadata.token in its JSON body instead (Flagger)",
        }
