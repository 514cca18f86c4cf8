"""The OpenAPI document: how it describes the bearer tokens (drf-spectacular extensions) and its two URLs."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.renderers import OpenApiJsonRenderer2, OpenApiYamlRenderer2
from drf_spectacular.views import SpectacularAPIView
from rest_framework.negotiation import BaseContentNegotiation


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


class FixedNegotiation(BaseContentNegotiation):
    """The view's first renderer, whatever the Accept header says: each format has its own URL."""

    def select_parser(self, request: Any, parsers: list[Any]) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Any, renderers: list[Any], format_suffix: str | None = None) -> Any:
        return (renderers[0], renderers[0].media_type)


class OpenApiJSON(SpectacularAPIView):
    """``/api/v1/openapi.json``: JSON as ``application/json`` for a plain GET (curl, most generators)."""

    renderer_classes = [OpenApiJsonRenderer2]
    content_negotiation_class = FixedNegotiation


class OpenApiYAML(SpectacularAPIView):
    """``/api/v1/openapi.yaml``: the same document as YAML."""

    renderer_classes = [OpenApiYamlRenderer2]
    content_negotiation_class = FixedNegotiation
