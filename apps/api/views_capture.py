"""The B0-capture resource of the REST API: what ``manage.py baseline_capture`` does, from a
server the operator named, pasted text, or an earlier experiment's approved manifest
(apps/approvals/capture_sources.py; docs/SPEC.md, "Capturing B0").

A server is picked by name (``TAILTUNE_CAPTURE_SOURCES``), never by address: a body with a
``url`` is refused naming that field, so no token can make the service fetch an address of its
choosing. Nothing is saved: the answer is the spec fragment (and, given a spec, the whole spec
with its B0 replaced), which the client then creates an experiment with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.roles import EXPERIMENTER, VIEWER
from apps.accounts.tokens import RUN
from apps.api.base import SPEC_ERRORS, ApiView, _clean_text, _errors
from apps.approvals.capture_sources import baseline_capture, capture_server_names
from apps.experiments import baseline_capture as bc
from apps.experiments.services import spec_limits
from apps.experiments.spec import MAX_SPEC_BYTES, SpecError, load_yaml, validate_spec
from apps.experiments.spec_capture import CAPTURE_SOURCES

FIELDS = frozenset({"source", "server", "text", "experiment", "container", "baseline_id", "note", "spec"})

CAPTURE_REQUEST = inline_serializer(
    "BaselineCaptureRequest",
    {
        "source": serializers.ChoiceField(choices=list(CAPTURE_SOURCES)),
        "server": serializers.CharField(
            required=False, help_text="source server: a name from GET /api/v1/baselines/capture"
        ),
        "text": serializers.CharField(
            required=False,
            help_text="source command, kubernetes or helm: the command line, manifest or values",
        ),
        "experiment": serializers.IntegerField(
            required=False,
            help_text="source manifest: the experiment whose approved manifest; none: the newest",
        ),
        "container": serializers.CharField(
            required=False, help_text="the container, where several start vLLM"
        ),
        "baseline_id": serializers.CharField(required=False, help_text="default B0"),
        "note": serializers.CharField(required=False, help_text="baseline.captured_from (free text)"),
        "spec": serializers.JSONField(
            required=False, help_text="a spec (object or YAML text): answered whole, its B0 replaced"
        ),
    },
)
CAPTURED = inline_serializer(
    "BaselineCaptured",
    {
        "fragment": serializers.DictField(help_text="model, controls, engine, baseline (with its capture)"),
        "yaml": serializers.CharField(help_text="the fragment, or the whole spec, as YAML"),
        "notes": serializers.ListField(child=serializers.CharField()),
        "spec": serializers.DictField(required=False, help_text="the spec given, its B0 replaced"),
    },
)
SOURCES = inline_serializer(
    "BaselineCaptureSources",
    {
        "sources": serializers.ListField(child=serializers.CharField()),
        "servers": serializers.ListField(child=serializers.CharField()),
    },
)


def _bad(field: str, message: str) -> Response:
    return Response({"errors": [{"field": field, "message": message}]}, status=status.HTTP_400_BAD_REQUEST)


class BaselineCapture(ApiView):
    scopes = {**ApiView.scopes, "POST": RUN}

    @extend_schema(
        responses={200: SOURCES},
        summary="Where B0 can be captured from: the sources and the servers' names",
        operation_id="baselines_capture_sources",
    )
    def get(self, request: Request) -> Response:
        self.need(VIEWER)
        return Response({"sources": list(CAPTURE_SOURCES), "servers": capture_server_names()})

    @extend_schema(
        request={"application/json": CAPTURE_REQUEST},
        responses={200: CAPTURED, 400: SPEC_ERRORS},
        summary="Capture B0 (a named server, a command line, a Kubernetes manifest, Helm values or a manifest)",
        operation_id="baselines_capture",
    )
    def post(self, request: Request) -> Response:
        self.need(EXPERIMENTER)
        data = request.data
        if not isinstance(data, Mapping):
            return _bad("body", "must be a JSON object")
        if "url" in data:
            return _bad(
                "url",
                "a server is picked by name (server), never by address: ask the operator to name it "
                "in TAILTUNE_CAPTURE_SOURCES",
            )
        unknown = sorted(set(map(str, data)) - FIELDS)
        if unknown:
            return Response(
                {"errors": [{"field": k[:64], "message": "unknown field"} for k in unknown]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        texts: dict[str, str | None] = {}
        for name, limit in (
            ("source", 32),
            ("server", 64),
            ("text", MAX_SPEC_BYTES),
            ("container", 253),
            ("baseline_id", 32),
            ("note", 500),
        ):
            value = data.get(name)
            if value is not None and not _clean_text(value, limit):
                return _bad(name, f"must be text of at most {limit} characters")
            texts[name] = value
        experiment = data.get("experiment")
        if experiment is not None and (isinstance(experiment, bool) or not isinstance(experiment, int | str)):
            return _bad("experiment", "must be an experiment's id")
        spec = data.get("spec")
        try:
            # The spec first: it costs nothing to read, the capture may take seconds.
            if isinstance(spec, str):
                spec = load_yaml(spec, where="spec")
            if spec is not None and not isinstance(spec, Mapping):
                return _bad("spec", "must be a spec (a mapping, or YAML text of one)")
            captured = baseline_capture(
                source=str(texts["source"] or ""),
                text=texts["text"],
                server=texts["server"],
                experiment=experiment,
                container=texts["container"],
            )
        except bc.CaptureBusy as exc:
            return Response(
                {"errors": _errors(exc)},
                status=status.HTTP_429_TOO_MANY_REQUESTS,
                headers={"Retry-After": "30"},
            )
        except SpecError as exc:
            return Response({"errors": _errors(exc)}, status=status.HTTP_400_BAD_REQUEST)
        note = texts["note"] or ""
        body: dict[str, Any] = {
            "fragment": bc.fragment(captured, baseline_id=texts["baseline_id"] or "B0", note=note),
            "notes": list(captured.notes),
        }
        out = body["fragment"]
        if spec is not None:
            out, more = bc.apply_to_spec(spec, captured, note=note)
            body["notes"] += more
            try:
                validate_spec(out, limits=spec_limits())
            except SpecError as exc:  # the spec's own paths, under the request's field
                return Response(
                    {"errors": [{"field": f"spec.{e.path}", "message": e.message} for e in exc.errors]},
                    status=status.HTTP_400_BAD_REQUEST,
                )
            body["spec"] = out
        body["yaml"] = yaml.safe_dump(out, sort_keys=False, default_flow_style=False, allow_unicode=True)
        return Response(body)
