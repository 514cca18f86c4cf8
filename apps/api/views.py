"""The versioned REST API, /api/v1/ (Django REST framework; the OpenAPI document by drf-spectacular).

Every endpoint needs a bearer token (apps/api/auth.py) and acts as the token's
user with that user's roles; the services are the same the pages call, so the
rules (four eyes, field errors, nothing half-saved) are the same too. Every
audit event written during an API call names the token.

Errors are JSON: ``{"detail": ...}``, and for a bad spec ``{"errors": [{"field",
"message"}]}`` with status 400.
"""

from __future__ import annotations

import json
import math
import re
from contextvars import Token
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ParseError
from rest_framework.exceptions import PermissionDenied as ApiForbidden
from rest_framework.parsers import BaseParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.models import ApiToken
from apps.accounts.roles import EXPERIMENTER, VIEWER, has_role
from apps.approvals.audit import audit_record, bind_token, unbind_token
from apps.approvals.models import RollbackManifest
from apps.approvals.services import ApprovalError, approval_revoke, experiment_approve
from apps.approvals.views import manifest_response
from apps.experiments import selectors
from apps.experiments.models import Experiment
from apps.experiments.services import experiment_create, spec_limits
from apps.experiments.spec import MAX_SPEC_BYTES, MAX_TOKENS, SpecError, load_yaml, validate_spec
from apps.runs.models import RequestRecord, Run
from apps.runs.selectors import run_record
from config.uploadhandlers import too_large_message
from workers.replay.records import SCALAR_RECORD_FIELDS

MAX_PAGE_SIZE = 5000


class YamlParser(BaseParser):
    """A spec sent as YAML text (bounded like every spec: apps/experiments/spec.load_yaml)."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read()
        try:
            return load_yaml(raw.decode("utf-8"), where="body")
        except UnicodeDecodeError as exc:
            raise ParseError(f"the body is not UTF-8 text (byte {exc.start})") from None
        except SpecError as exc:
            raise ParseError({"errors": _errors(exc)}) from None


def _errors(exc: SpecError) -> list[dict[str, str]]:
    return [{"field": e.path, "message": e.message} for e in exc.errors]


class SpecJsonParser(JSONParser):
    """JSON bounded like a YAML spec: at most MAX_SPEC_BYTES, and nesting that Python can read."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        request = (parser_context or {}).get("request")
        raw_length = request.META.get("CONTENT_LENGTH") if request is not None else None
        length = (
            int(raw_length) if raw_length and str(raw_length).isascii() and str(raw_length).isdigit() else 0
        )
        if length > MAX_SPEC_BYTES:
            raise ParseError(
                {"errors": [{"field": "body", "message": f"is {length} bytes; at most {MAX_SPEC_BYTES}"}]}
            )
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError({"errors": [{"field": "body", "message": "is nested too deeply"}]}) from None


class ApiView(APIView):
    """Binds the request's token to the audit trail for exactly the length of the call."""

    parser_classes = [SpecJsonParser]

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        binding: Token[str | None] = bind_token(None)
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            unbind_token(binding)  # whatever happened: the name never outlives this call

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


def _summary(experiment: Experiment) -> dict[str, Any]:
    progress = selectors.experiment_progress(experiment=experiment)
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    return {
        "id": experiment.pk,
        "name": experiment.name,
        "owner": experiment.owner.get_username(),
        "status": experiment.status,
        "status_reason": experiment.status_reason,
        "progress": {
            "total": progress.total,
            "finished": progress.finished,
            "by_status": progress.by_status,
            "eta_s": progress.eta_s,
        },
        "decision": None
        if decision is None
        else {"outcome": decision.outcome, "chosen_cell": decision.chosen_cell, "rule": decision.rule},
    }


EXPERIMENT = inline_serializer(
    "Experiment",
    {
        "id": serializers.IntegerField(),
        "name": serializers.CharField(),
        "owner": serializers.CharField(),
        "status": serializers.CharField(),
        "status_reason": serializers.CharField(),
        "progress": serializers.DictField(),
        "decision": serializers.DictField(allow_null=True),
    },
)
EXPERIMENTS = inline_serializer(
    "ExperimentPage",
    {"experiments": serializers.ListField(child=serializers.DictField())},
)
SPEC_ERRORS = inline_serializer(
    "SpecErrors",
    {"errors": serializers.ListField(child=serializers.DictField(child=serializers.CharField()))},
)


class ExperimentList(ApiView):
    parser_classes = [SpecJsonParser, YamlParser]

    @extend_schema(
        responses={200: EXPERIMENTS}, summary="Experiments, newest first", operation_id="experiments_list"
    )
    def get(self, request: Request) -> Response:
        self.need(VIEWER)
        experiments = Experiment.objects.select_related("owner").order_by("-created_at")[:200]
        return Response({"experiments": [_summary(e) for e in experiments]})

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT, "application/yaml": OpenApiTypes.STR},
        responses={201: EXPERIMENT, 400: SPEC_ERRORS},
        summary="Create an experiment from a spec (JSON or YAML); the token's user is its author",
    )
    def post(self, request: Request) -> Response:
        self.need(EXPERIMENTER)
        try:
            spec = validate_spec(request.data, limits=spec_limits())
            experiment = experiment_create(spec=spec, owner=request.user)
        except SpecError as exc:
            return Response({"errors": _errors(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(_summary(experiment), status=status.HTTP_201_CREATED)


class ExperimentDetail(ApiView):
    @extend_schema(responses={200: EXPERIMENT}, summary="Status, progress and decision")
    def get(self, request: Request, pk: int) -> Response:
        return Response(_summary(self.experiment(pk)))


class ExperimentStart(ApiView):
    @extend_schema(request=None, responses={202: EXPERIMENT, 409: OpenApiTypes.OBJECT}, summary="Start")
    def post(self, request: Request, pk: int) -> Response:
        from apps.runs.services import experiment_start

        experiment = self.experiment(pk)
        if not selectors.can_operate(request.user, experiment):
            raise ApiForbidden("only the experiment's author can start it")
        try:
            experiment_start(experiment=experiment, actor=request.user)
        except ValueError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        experiment.refresh_from_db()
        return Response(_summary(experiment), status=status.HTTP_202_ACCEPTED)


class ExperimentCancel(ApiView):
    @extend_schema(request=None, responses={200: EXPERIMENT, 409: OpenApiTypes.OBJECT}, summary="Cancel")
    def post(self, request: Request, pk: int) -> Response:
        from apps.runs.services import experiment_cancel

        experiment = self.experiment(pk)
        if not selectors.can_operate(request.user, experiment):
            raise ApiForbidden("only the experiment's author can cancel it")
        if experiment.status != Experiment.Status.RUNNING:
            return Response(
                {"detail": f"the experiment is {experiment.status}"}, status=status.HTTP_409_CONFLICT
            )
        experiment_cancel(experiment=experiment, actor=request.user)
        experiment.refresh_from_db()
        if experiment.status != Experiment.Status.CANCELLED:
            return Response(
                {"detail": f"the experiment is {experiment.status}"}, status=status.HTTP_409_CONFLICT
            )
        return Response(_summary(experiment))


class ExperimentReport(ApiView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, 409: OpenApiTypes.OBJECT},
        summary="The report: the same JSON as `experiment_report --format json`",
    )
    def get(self, request: Request, pk: int) -> Response:
        experiment = self.experiment(pk)
        decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
        if decision is None or not decision.report:
            return Response({"detail": f"no report yet: the experiment is {experiment.status}"}, status=409)
        return Response(decision.report)


APPROVAL = inline_serializer(
    "Approval",
    {
        "chosen_cell": serializers.CharField(),
        "reason": serializers.CharField(),
        "recovery_override": serializers.CharField(required=False),
        "scenarios_override": serializers.CharField(required=False),
        "deployment_revision": serializers.CharField(),
        "route_target": serializers.CharField(),
    },
)


class ExperimentApprove(ApiView):
    @extend_schema(
        request=APPROVAL,
        responses={201: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT, 403: OpenApiTypes.OBJECT},
        summary="Approve (approver, not the author): freezes the rollback manifest",
    )
    def post(self, request: Request, pk: int) -> Response:
        experiment = self.experiment(pk)
        if not isinstance(request.data, dict):
            return Response({"errors": [{"field": "body", "message": "must be a JSON object"}]}, status=400)
        data = request.data
        fields = {
            k: data.get(k, "")
            for k in (
                "chosen_cell",
                "reason",
                "recovery_override",
                "scenarios_override",
                "deployment_revision",
                "route_target",
            )
        }
        bad = [k for k, v in fields.items() if not _clean_text(v, 2000)]
        if bad:
            return Response(
                {"errors": [{"field": k, "message": "must be text of at most 2000 characters"} for k in bad]},
                status=400,
            )
        try:
            manifest = experiment_approve(experiment=experiment, approver=request.user, **fields)
        except PermissionDenied as exc:
            raise ApiForbidden(str(exc)) from None
        except ApprovalError as exc:
            body: dict[str, Any] = {"detail": str(exc)}
            if exc.field:
                body["errors"] = [{"field": exc.field, "message": str(exc)}]
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        return Response(
            {
                "experiment": experiment.pk,
                "chosen_cell": fields["chosen_cell"],
                "manifest_sha256": manifest.sha256,
            },
            status=status.HTTP_201_CREATED,
        )


REVOCATION = inline_serializer("Revocation", {"reason": serializers.CharField()})


class ExperimentRevoke(ApiView):
    @extend_schema(
        request=REVOCATION,
        responses={200: EXPERIMENT, 400: OpenApiTypes.OBJECT, 403: OpenApiTypes.OBJECT},
        summary="Revoke an approval (an approver): the manifest is superseded, its digest still verifies",
    )
    def post(self, request: Request, pk: int) -> Response:
        experiment = self.experiment(pk)
        reason = request.data.get("reason", "") if isinstance(request.data, dict) else None
        if not _clean_text(reason, 2000):
            return Response(
                {"errors": [{"field": "reason", "message": "must be text of at most 2000 characters"}]},
                status=400,
            )
        try:
            approval_revoke(experiment=experiment, actor=request.user, reason=str(reason))
        except PermissionDenied as exc:
            raise ApiForbidden(str(exc)) from None
        except ApprovalError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        experiment.refresh_from_db()
        return Response(_summary(experiment))


class ExperimentManifest(ApiView):
    @extend_schema(
        parameters=[OpenApiParameter("fmt", str, OpenApiParameter.PATH, enum=["json", "yaml"])],
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "application/yaml"): OpenApiTypes.STR,
        },
        summary="The approved rollback manifest, byte for byte as stored (header X-Manifest-File-Sha256)",
    )
    def get(self, request: Request, pk: int, fmt: str) -> HttpResponse:
        self.experiment(pk)
        if fmt not in ("json", "yaml"):
            raise NotFound("the manifest comes as json or yaml")
        manifest = RollbackManifest.objects.filter(experiment_id=pk).first()
        if manifest is None:
            raise NotFound("no manifest: the experiment is not approved")
        return manifest_response(manifest, fmt)


TRACE_UPLOAD = inline_serializer(
    "TraceUpload",
    {
        "file": serializers.FileField(),
        "format": serializers.ChoiceField(
            choices=["tailtune", "azure", "burstgpt", "mooncake", "vllm-timed"]
        ),
        "model_dir": serializers.CharField(
            help_text="the tokenizer's model directory, as this server sees it"
        ),
        "tokenizer_revision": serializers.CharField(),
        "max_model_len": serializers.IntegerField(),
        "classes": serializers.CharField(help_text="split by input length, e.g. short:1024,long"),
        "busiest": serializers.FloatField(
            required=False, help_text="keep the busiest window of this many seconds"
        ),
        "label": serializers.CharField(required=False),
    },
)


class TraceUpload(ApiView):
    parser_classes = [MultiPartParser]

    @extend_schema(
        request={"multipart/form-data": TRACE_UPLOAD},
        responses={202: OpenApiTypes.OBJECT, 400: SPEC_ERRORS},
        summary="Upload a trace (its real arrival times kept); a worker imports it",
        description=(
            "The file streams to disk (capped by TAILTUNE_MAX_UPLOAD_BYTES) and the fields are "
            "checked here; parsing, the busiest window and the prompts run on a worker. The "
            "answer (202) names the upload; GET its url until status is done (then sha256) or "
            "failed (then errors, each naming its field and line)."
        ),
    )
    def post(self, request: Request) -> Response:
        from apps.experiments.models import TraceUpload as Upload
        from apps.experiments.uploads import upload_queue
        from apps.workloads.importers import DEFAULT_MAX_BYTES, parse_class_thresholds
        from apps.workloads.services import tokenizer_dir

        self.need(EXPERIMENTER)
        upload = request.FILES.get("file")
        data = request.data
        errors = []
        too_large = upload_too_large(request, "file")
        if too_large:
            errors.append({"field": "file", "message": too_large})
        elif upload is None:
            errors.append({"field": "file", "message": "is required"})
        elif upload.size > DEFAULT_MAX_BYTES:
            errors.append(
                {"field": "file", "message": f"is {upload.size} bytes; at most {DEFAULT_MAX_BYTES}"}
            )
        fmt = str(data.get("format", ""))
        if fmt not in ("tailtune", "azure", "burstgpt", "mooncake", "vllm-timed"):
            errors.append(
                {"field": "format", "message": "must be tailtune, azure, burstgpt, mooncake or vllm-timed"}
            )
        imported = fmt != "tailtune"
        texts: dict[str, str] = {}
        for name in ("model_dir", "tokenizer_revision", "classes", "label"):
            raw = data.get(name, "")
            if not _clean_text(raw, 500):
                errors.append({"field": name, "message": "must be text of at most 500 characters"})
            elif imported and name != "label" and not raw.strip():
                errors.append({"field": name, "message": "is required for an imported format"})
            else:
                texts[name] = raw.strip()
        max_model_len = _number(
            data, "max_model_len", errors, integer=True, low=2, high=MAX_TOKENS, required=imported
        )
        busiest = _number(data, "busiest", errors, integer=False, low=1e-3, high=86_400.0, required=False)
        thresholds: list[tuple[str, int | None]] = []
        if imported and "classes" in texts:
            try:
                thresholds = parse_class_thresholds(texts["classes"])
            except ValueError as exc:
                errors.append({"field": "classes", "message": str(exc)})
        if imported and texts.get("model_dir"):
            model_dir = tokenizer_dir(texts["model_dir"])
            if not (model_dir / "tokenizer.json").is_file():
                errors.append({"field": "model_dir", "message": f"no tokenizer.json in {model_dir}"})
        if errors:
            return Response({"errors": errors}, status=status.HTTP_400_BAD_REQUEST)
        assert upload is not None
        options: dict[str, Any] = {"label": texts.get("label") or upload.name[:200]}
        if imported:
            options.update(
                model_dir=texts["model_dir"],
                tokenizer_revision=texts["tokenizer_revision"],
                max_model_len=int(max_model_len or 0),
            )
        row = upload_queue(
            kind=Upload.Kind.TRACE,
            owner=request.user,
            upload=upload,
            trace_format=fmt,
            thresholds=thresholds,
            busiest_s=busiest,
            options=options,
        )
        audit_record(
            action="trace.uploaded",
            actor=request.user,
            target=f"trace upload {row.pk}",
            detail={"format": fmt, "label": options["label"], "bytes": row.size_bytes},
        )
        body = _upload_resource(row)
        return Response(body, status=status.HTTP_202_ACCEPTED, headers={"Location": body["url"]})


class TraceUploadDetail(ApiView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, 404: OpenApiTypes.OBJECT},
        summary="A trace upload: queued, importing, done (its sha256) or failed (its errors)",
    )
    def get(self, request: Request, pk: int) -> Response:
        from apps.experiments.models import TraceUpload as Upload

        self.need(EXPERIMENTER)
        row = Upload.objects.filter(pk=pk, kind=Upload.Kind.TRACE, owner=request.user).first()
        if row is None:  # another user's upload is not found, not forbidden: ids tell nothing
            raise NotFound("no such trace upload of yours")
        return Response(_upload_resource(row))


def upload_resource(row: Any, *, url_name: str) -> dict[str, Any]:
    """What the API says of any upload a worker imports (apps/experiments/uploads.py): where it
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


def _upload_resource(row: Any) -> dict[str, Any]:
    """A trace uploaded alone: its format, and once imported its sha256."""
    from apps.workloads.models import Trace

    body = {**upload_resource(row, url_name="api:trace-upload"), "format": row.trace_format}
    if row.status == row.Status.DONE:
        trace = Trace.objects.filter(sha256=row.trace_sha256).first()
        body["sha256"] = row.trace_sha256
        if trace is not None:
            body.update(requests=trace.requests, duration_s=trace.duration_s)
    return body


class RunDetail(ApiView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        summary="One run's record: cell, repeat, hashes, image digest, revisions, hardware, effective args, windows",
    )
    def get(self, request: Request, run_id: str) -> Any:
        self.need(VIEWER)
        run = (
            Run.objects.select_related("cell", "host", "retry_of").filter(run_id=run_id).first()
            if _uuid(run_id)
            else None
        )
        if run is None:
            raise NotFound(f"no run {run_id}")
        record = run_record(run)
        record["records_url"] = reverse("api:records", kwargs={"run_id": record["run_id"]})
        return Response(record)


class RunRecords(ApiView):
    @extend_schema(
        parameters=[
            OpenApiParameter("page", int, description="1-based page (JSON form)"),
            OpenApiParameter("page_size", int, description=f"records per page, at most {MAX_PAGE_SIZE}"),
            OpenApiParameter(
                "format", str, enum=["json", "jsonl"], description="jsonl: every record, streamed"
            ),
        ],
        responses={200: OpenApiTypes.OBJECT},
        summary="A run's request records, paged JSON or streamed JSONL",
    )
    def get(self, request: Request, run_id: str) -> Any:
        self.need(VIEWER)
        run = Run.objects.filter(run_id=run_id).first() if _uuid(run_id) else None
        if run is None:
            raise NotFound(f"no run {run_id}")
        rows = RequestRecord.objects.filter(run=run).order_by("index")
        fields = ("index", *[f for f in SCALAR_RECORD_FIELDS if f != "index"])
        if request.query_params.get("format") == "jsonl":

            def lines() -> Any:
                for row in rows.values(*fields).iterator(chunk_size=2000):
                    yield json.dumps(row, separators=(",", ":")) + "\n"

            return StreamingHttpResponse(lines(), content_type="application/x-ndjson")
        page = _positive(request, "page", 1)
        size = min(_positive(request, "page_size", 1000), MAX_PAGE_SIZE)
        total = rows.count()
        items = list(rows.values(*fields)[(page - 1) * size : page * size])
        return Response(
            {"run": str(run.run_id), "count": total, "page": page, "page_size": size, "records": items}
        )


def _uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


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


def _number(
    data: Any,
    name: str,
    errors: list[dict[str, str]],
    *,
    integer: bool,
    low: float,
    high: float,
    required: bool,
) -> float | None:
    """A finite number from a form field within [low, high], or a field error."""
    raw = data.get(name)
    if raw in (None, ""):
        if required:
            errors.append({"field": name, "message": "is required"})
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        errors.append({"field": name, "message": f"must be a number, got {str(raw)[:40]!r}"})
        return None
    if not math.isfinite(value) or not low <= value <= high or (integer and not value.is_integer()):
        kind = "a whole number" if integer else "a number"
        errors.append({"field": name, "message": f"must be {kind} from {low:g} to {high:g}"})
        return None
    return value


def _positive(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        raise ParseError(
            {"errors": [{"field": name, "message": f"must be a positive whole number, got {raw!r}"}]}
        )
    return int(raw)
