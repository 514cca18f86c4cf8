"""What every resource of the REST API shares: the base view (token, audit binding, role
checks), the bounded JSON and YAML parsers, the error bodies, and the checks of form fields
and uploads.

The resources: apps/api/views.py (experiments), views_runs.py (runs and their records),
views_traces.py (trace uploads), views_hosts.py (the names hosts offer) and gates.py (the gate).
"""

from __future__ import annotations

import io
from contextvars import Token
from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.exceptions import PermissionDenied as ApiForbidden
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.request import Request
from rest_framework.views import APIView

from apps.accounts.models import ApiToken
from apps.accounts.roles import VIEWER, has_role
from apps.accounts.tokens import READ
from apps.audit.services import bind_token, unbind_token
from apps.experiments.models import Experiment
from apps.experiments.spec import MAX_SPEC_BYTES, SpecError, load_yaml
from apps.lifecycle import selectors
from config.bodylimits import too_much_message
from config.params import declared_length
from config.uploadhandlers import too_large_message


class BodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


def _declared_length(parser_context: Any) -> int:
    request = (parser_context or {}).get("request")
    return declared_length(request.META.get("CONTENT_LENGTH")) if request is not None else 0


def read_bounded(stream: Any, parser_context: Any, *, limit: int, what: str) -> bytes:
    """The body, refused (413) before a byte is read when its Content-Length passes ``limit``, and
    never read past ``limit`` bytes whatever the header said."""
    length = _declared_length(parser_context)
    if length > limit:
        raise BodyTooLarge(f"the body is {length} bytes; {what} is at most {limit} bytes")
    raw = stream.read(limit + 1) if stream is not None else b""
    if len(raw) > limit:
        raise BodyTooLarge(f"the body is over {limit} bytes; {what} is at most {limit} bytes")
    return bytes(raw)


class YamlParser(BaseParser):
    """A spec sent as YAML text (bounded like every spec: apps/experiments/spec.load_yaml), refused
    unread past MAX_SPEC_BYTES."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = read_bounded(stream, parser_context, limit=MAX_SPEC_BYTES, what="a spec")
        try:
            return load_yaml(raw.decode("utf-8"), where="body")
        except UnicodeDecodeError as exc:
            raise ParseError(f"the body is not UTF-8 text (byte {exc.start})") from None
        except SpecError as exc:
            raise ParseError({"errors": _errors(exc)}) from None


def _errors(exc: SpecError) -> list[dict[str, str]]:
    return [{"field": e.path, "message": e.message} for e in exc.errors]


class SpecJsonParser(BaseParser):
    """JSON bounded like a YAML spec: refused unread past MAX_SPEC_BYTES, and nesting that Python
    can read. Not a JSONParser subclass: REST framework reads a JSONParser's whole body first
    (up to TAILTUNE_MAX_REQUEST_BYTES); this one reads only what the spec's limit allows."""

    media_type = JSONParser.media_type
    renderer_class = JSONParser.renderer_class

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = read_bounded(stream, parser_context, limit=MAX_SPEC_BYTES, what="a JSON body")
        try:
            return JSONParser().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError:
            raise ParseError({"errors": [{"field": "body", "message": "is nested too deeply"}]}) from None


class ApiView(APIView):
    """Binds the request's token to the audit trail for exactly the length of the call.

    ``scopes`` names the token scope each method needs (apps/api/auth.py TokenScope): reading
    needs ``read``; a view that takes a POST says which scope it needs, and until it does the
    POST is refused."""

    parser_classes = [SpecJsonParser]
    scopes: dict[str, str] = {"GET": READ, "HEAD": READ, "OPTIONS": READ}

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        binding: Token[str | None] = bind_token(None)
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            unbind_token(binding)  # whatever happened: the name never outlives this call

    def handle_exception(self, exc: Exception) -> Any:
        """A body past Django's own caps (fields, files, bytes) is a 413 naming the limit, not a 400 page."""
        too_much = too_much_message(exc)
        if too_much is not None:
            exc = BodyTooLarge(too_much)
        return super().handle_exception(exc)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if isinstance(request.auth, ApiToken):
            bind_token(request.auth.name)  # undone with dispatch's own binding

    def need(self, role: str) -> None:
        if role == VIEWER:
            if not selectors.can_read(self.request.user):
                raise ApiForbidden("this needs the viewer, experimenter or approver role")
        elif not has_role(self.request.user, role):
            raise ApiForbidden(f"this needs the {role} role")

    def experiment(self, pk: int) -> Experiment:
        self.need(VIEWER)
        return get_object_or_404(Experiment.objects.select_related("owner", "workload"), pk=pk)


SPEC_ERRORS = inline_serializer(
    "SpecErrors",
    {"errors": serializers.ListField(child=serializers.DictField(child=serializers.CharField()))},
)


def upload_resource(row: Any, *, url_name: str) -> dict[str, Any]:
    """What the API says of any upload a worker imports (apps/lifecycle/trace_upload.py): where it
    is, its file and status, and once failed its errors, stored as "field: message"."""
    body: dict[str, Any] = {
        "upload": row.pk,
        "url": reverse(url_name, args=[row.pk]),
        "status": row.status,
        "file": row.file_name,
        "bytes": row.size_bytes,
    }
    if row.status == row.Status.FAILED:
        body["errors"] = [
            {"field": field, "message": message}
            for field, _, message in (error.partition(": ") for error in row.errors)
        ]
    return body


def upload_too_large(request: Request, field: str) -> str | None:
    """The field error for a file dropped past the upload cap (config/uploadhandlers.py), if any."""
    limit = (getattr(request._request, "uploads_too_large", None) or {}).get(field)
    return None if limit is None else too_large_message(limit)


def _clean_text(value: Any, limit: int) -> bool:
    """A string the database stores as given: UTF-8, no NUL, at most ``limit`` characters."""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
