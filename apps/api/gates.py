"""The gate through the API: start one (``POST /api/v1/gates``) and read its verdict resource.

``GET /api/v1/gates/<id>`` always answers 200 with the verdict JSON (Argo Rollouts'
``web`` metric provider reads ``verdict`` with ``successCondition``). ``POST`` to
the same resource is for Flagger's webhooks, which judge by status code only:
200 when the verdict is ``pass``, 412 otherwise (running, regression,
inconclusive), the same JSON in the body. Flagger cannot send headers, so that
POST may carry the token as ``metadata.token`` in its body (docs/GATE.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.roles import EXPERIMENTER
from apps.accounts.tokens import READ, RUN
from apps.api.auth import TokenAuthentication
from apps.api.base import SPEC_ERRORS, ApiView, _clean_text, _errors, upload_resource, upload_too_large
from apps.audit.services import audit_record
from apps.experiments.models import TraceUpload
from apps.experiments.spec import SpecError
from apps.gate.build import MIN_REPEATS, GateInput
from apps.gate.services import GATE_FORMATS, gate_check, gate_resource
from apps.gate.uploads import gate_upload_queue
from apps.gate.verdict_types import GateResource
from apps.runs.hosts import hosts_alive

CLIENT = Path(settings.BASE_DIR) / "clients" / "tailtune_gate.py"

GATE_REQUEST = inline_serializer(
    "GateRequest",
    {
        "trace": serializers.FileField(help_text="the real traffic window"),
        "format": serializers.ChoiceField(choices=list(GATE_FORMATS)),
        "busiest": serializers.FloatField(
            required=False, help_text="keep the busiest window of this many seconds"
        ),
        "classes": serializers.CharField(
            required=False, help_text="split by input length, e.g. short:1024,long"
        ),
        "spec": serializers.CharField(
            required=False,
            help_text="the gate file (YAML/JSON): model, controls, engine, baseline, classes, workload",
        ),
        "baseline_manifest": serializers.CharField(
            required=False,
            help_text="B0 as last approved: a rollback manifest this server issued (not revoked)",
        ),
        "baseline_args": serializers.CharField(
            required=False, help_text='JSON object, e.g. {"max_num_seqs": 64}'
        ),
        "candidate_args": serializers.CharField(
            required=False, help_text="JSON object: the overlay on B0's args"
        ),
        "candidate_image": serializers.CharField(
            required=False,
            help_text="another engine build: an image the host lists in TAILTUNE_VLLM_COMMANDS",
        ),
        "candidate_model_revision": serializers.CharField(required=False),
        "repeats": serializers.IntegerField(required=False, default=2),
        "name": serializers.CharField(required=False),
    },
)
GATE = inline_serializer(
    "GateVerdict",
    {
        "gate": serializers.IntegerField(),
        "url": serializers.CharField(),
        "status": serializers.CharField(),
        "verdict": serializers.ChoiceField(choices=["running", "pass", "regression", "inconclusive"]),
        "exit_code": serializers.IntegerField(allow_null=True),
        "pass": serializers.BooleanField(),
        "reasons": serializers.ListField(child=serializers.CharField()),
        "cases": serializers.ListField(child=serializers.DictField()),
    },
)

GATE_UPLOAD = inline_serializer(
    "GateUpload",
    {
        "upload": serializers.IntegerField(),
        "url": serializers.CharField(help_text="this resource: GET it until status is done or failed"),
        "status": serializers.ChoiceField(choices=["queued", "importing", "done", "failed"]),
        "file": serializers.CharField(),
        "bytes": serializers.IntegerField(),
        "gate": GATE,
        "errors": serializers.ListField(child=serializers.DictField(), required=False),
    },
)
NO_HOST = "no host is alive to run the gate: no worker has sent a heartbeat lately"


def _json_object(data: Any, key: str, errors: list[dict[str, str]]) -> dict[str, Any]:
    raw = data.get(key)
    if raw in (None, ""):
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        errors.append({"field": key, "message": f"is not JSON: {exc.msg}"})
        return {}
    if not isinstance(value, dict):
        errors.append({"field": key, "message": "must be a JSON object of arg: value"})
        return {}
    return value


def _base_url(request: Request) -> str:
    return request.build_absolute_uri("/").rstrip("/")


class GateCreate(ApiView):
    parser_classes = [MultiPartParser]
    scopes = {"POST": RUN}  # a gate starts runs on a GPU host

    @extend_schema(
        request={"multipart/form-data": GATE_REQUEST},
        responses={202: GATE_UPLOAD, 400: SPEC_ERRORS, 503: OpenApiTypes.OBJECT},
        summary="Start a gate: B0 and the candidate paired on a real traffic window (docs/GATE.md)",
        description=(
            "The fields that need no window are checked here (400, or 503 when no host is alive); "
            "the window streams to disk and a worker cuts it and starts the gate. The answer (202) "
            "names the upload: GET its url until status is done (then gate: the verdict resource) "
            "or failed (then errors, each naming its field, the trace's with its line)."
        ),
        operation_id="gates_start",
    )
    def post(self, request: Request) -> Response:
        self.need(EXPERIMENTER)
        data = request.data
        errors: list[dict[str, str]] = []
        upload = request.FILES.get("trace")
        too_large = upload_too_large(request, "trace")
        if too_large:
            errors.append({"field": "trace", "message": too_large})
        elif upload is None:
            errors.append({"field": "trace", "message": "is required (the traffic window's file)"})
        texts: dict[str, str | None] = {}
        for key, limit in (
            ("format", 32),
            ("classes", 2000),
            ("name", 200),
            ("spec", 1_000_000),
            ("baseline_manifest", 1_000_000),
            ("candidate_image", 200),
            ("candidate_model_revision", 200),
        ):
            raw = data.get(key)
            if raw in (None, ""):
                texts[key] = None
            elif not _clean_text(raw, limit):
                errors.append({"field": key, "message": f"must be text of at most {limit} characters"})
            else:
                texts[key] = raw
        numbers: dict[str, Any] = {}
        for key, cast in (("busiest", float), ("repeats", int)):
            raw = data.get(key)
            if raw in (None, ""):
                continue
            try:
                numbers[key] = cast(raw)
            except (TypeError, ValueError):
                errors.append(
                    {"field": key, "message": f"must be {'an integer' if cast is int else 'a number'}"}
                )
        if "busiest" in numbers and not 0 < numbers["busiest"] <= 86_400:
            errors.append({"field": "busiest", "message": "must be between 0 and 86400 seconds"})
        if "repeats" in numbers and not MIN_REPEATS <= numbers["repeats"] <= 100:
            errors.append({"field": "repeats", "message": f"must be between {MIN_REPEATS} and 100"})
        baseline_args = _json_object(data, "baseline_args", errors)
        candidate_args = _json_object(data, "candidate_args", errors)
        if not texts.get("format"):
            errors.append({"field": "format", "message": "is required"})
        if errors:
            return Response({"errors": errors}, status=status.HTTP_400_BAD_REQUEST)
        assert upload is not None
        fields = {**texts, **numbers, "baseline_args": baseline_args, "candidate_args": candidate_args}
        try:
            gate_check(GateInput.from_fields(fields))  # all that needs no window, answered now
        except SpecError as exc:
            return Response({"errors": _errors(exc)}, status=status.HTTP_400_BAD_REQUEST)
        if not hosts_alive():
            return Response({"detail": NO_HOST}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
        # The window is parsed, cut and started on a worker (apps/gate/uploads.py), not here.
        row = gate_upload_queue(owner=request.user, upload=upload, fields=fields)
        audit_record(
            action="gate.uploaded",
            actor=request.user,
            target=f"trace upload {row.pk}",
            detail={"format": row.trace_format, "bytes": row.size_bytes, "name": fields.get("name")},
        )
        body = _gate_upload(row, request)
        return Response(body, status=status.HTTP_202_ACCEPTED, headers={"Location": body["url"]})


class GateUploadDetail(ApiView):
    @extend_schema(
        responses={200: GATE_UPLOAD, 404: OpenApiTypes.OBJECT},
        summary="A gate being started: queued, importing, done (the gate) or failed (the errors)",
        operation_id="gates_upload",
    )
    def get(self, request: Request, pk: int) -> Response:
        self.need(EXPERIMENTER)
        row = (
            TraceUpload.objects.select_related("experiment")
            .filter(pk=pk, kind=TraceUpload.Kind.GATE, owner=request.user)
            .first()
        )
        if row is None:  # another user's upload is not found, not forbidden: ids tell nothing
            raise NotFound("no such gate upload of yours")
        return Response(_gate_upload(row, request))


def _gate_upload(row: TraceUpload, request: Request) -> dict[str, Any]:
    body = upload_resource(row, url_name="api:gate-upload")
    if row.status == TraceUpload.Status.DONE and row.experiment is not None:
        body["gate"] = gate_resource(experiment=row.experiment, base_url=_base_url(request))
    return body


class TokenInBodyAuthentication(TokenAuthentication):
    """The bearer header, or (for Flagger's webhook, which sends no headers) ``metadata.token``."""

    def authenticate(self, request: Any) -> Any:
        got = super().authenticate(request)
        if got is not None or request.method != "POST":
            return got
        try:
            body = json.loads(request.body or b"{}")
        except (ValueError, UnicodeDecodeError):
            return None
        token_text = ((body.get("metadata") or {}) if isinstance(body, dict) else {}).get("token")
        if not isinstance(token_text, str) or not token_text:
            return None
        return self.check(request, token_text.strip())


class GateVerdict(ApiView):
    authentication_classes = [TokenInBodyAuthentication]
    parser_classes = [JSONParser]
    # Flagger's webhook POSTs to read the verdict: reading, so the read scope.
    scopes = {**ApiView.scopes, "POST": READ}

    def _resource(self, request: Request, pk: int) -> GateResource:
        experiment = self.experiment(pk)  # the viewer role first, then 404
        try:
            return gate_resource(
                experiment=experiment,
                candidate=request.query_params.get("candidate"),
                base_url=_base_url(request),
            )
        except ValueError as exc:
            raise exceptions.ValidationError(
                {"errors": [{"field": "candidate", "message": str(exc)}]}
            ) from None

    @extend_schema(
        parameters=[OpenApiParameter("candidate", str, OpenApiParameter.QUERY, required=False)],
        responses={200: GATE, 400: SPEC_ERRORS},
        summary="The gate's verdict (Argo Rollouts' web metric: successCondition on verdict)",
        operation_id="gates_verdict",
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(self._resource(request, pk))

    @extend_schema(
        parameters=[OpenApiParameter("candidate", str, OpenApiParameter.QUERY, required=False)],
        request=OpenApiTypes.OBJECT,
        responses={200: GATE, 412: GATE},
        summary="The verdict for Flagger's webhook: 200 only on pass, 412 otherwise",
        operation_id="gates_webhook",
    )
    def post(self, request: Request, pk: int) -> Response:
        resource = self._resource(request, pk)
        return Response(resource, status=200 if resource["pass"] else status.HTTP_412_PRECONDITION_FAILED)


class GateClient(APIView):
    """The single-file remote client (httpx only), so a CI runner fetches it from its own server."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(responses={(200, "text/x-python"): OpenApiTypes.STR}, summary="The gate's remote client")
    def get(self, request: Request) -> FileResponse:
        return FileResponse(
            open(CLIENT, "rb"), content_type="text/x-python", as_attachment=True, filename="tailtune_gate.py"
        )
