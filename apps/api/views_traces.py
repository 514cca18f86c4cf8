"""The trace-uploads resource of the REST API: upload a trace (a worker imports it) and read
the upload's status until it is done or failed."""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.roles import EXPERIMENTER
from apps.accounts.tokens import RUN
from apps.api.base import SPEC_ERRORS, ApiView, _clean_text, upload_resource, upload_too_large
from apps.audit.services import audit_record
from apps.experiments.spec import MAX_TOKENS

# What POST /api/v1/traces reads: the importers' formats, and request logs in the OpenAI request
# format (their prompts, redacted, become the trace's corpus).
FORMATS = ("tailtune", "azure", "burstgpt", "mooncake", "vllm-timed", "openai-log")
# Literal redaction terms: an experimenter names words, never a regular expression (a pattern
# from the API could backtrack for hours on a worker); the command line, run by an operator,
# takes patterns.
MAX_REDACT_TERMS = 100
MAX_REDACT_TERM_CHARS = 200

TRACE_UPLOAD = inline_serializer(
    "TraceUpload",
    {
        "file": serializers.FileField(),
        "format": serializers.ChoiceField(choices=list(FORMATS)),
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
        "redact": serializers.CharField(
            required=False,
            help_text="openai-log only, required there: what is sensitive, replaced before "
            "anything is stored: a comma list of email, key, number, or none",
        ),
        "redact_terms": serializers.CharField(
            required=False,
            help_text="openai-log only: literal words or phrases, one a line, replaced by "
            "[REDACTED] (kept only as their sha256)",
        ),
        "output_tokens": serializers.IntegerField(
            required=False, help_text="openai-log only: the output length of a request that logs none"
        ),
    },
)


class TraceUpload(ApiView):
    parser_classes = [MultiPartParser]
    scopes = {"POST": RUN}

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
        from apps.experiments.model_roots import model_path_error
        from apps.experiments.models import TraceUpload as Upload
        from apps.lifecycle.trace_upload import upload_queue
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
        if fmt not in FORMATS:
            errors.append({"field": "format", "message": f"must be one of {', '.join(FORMATS)}"})
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
        redaction = _redaction(data, errors) if fmt == "openai-log" else {}
        thresholds: list[tuple[str, int | None]] = []
        if imported and "classes" in texts:
            try:
                thresholds = parse_class_thresholds(texts["classes"])
            except ValueError as exc:
                errors.append({"field": "classes", "message": str(exc)})
        if imported and texts.get("model_dir"):
            # Under the model roots first: outside them the answer never depends on what exists.
            outside = model_path_error(texts["model_dir"])
            model_dir = tokenizer_dir(texts["model_dir"])
            if outside is not None:
                errors.append({"field": "model_dir", "message": outside})
            elif not (model_dir / "tokenizer.json").is_file():
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
                **redaction,
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


def _redaction(data: Any, errors: list[dict[str, str]]) -> dict[str, Any]:
    """A request log's redaction fields (``redact``, ``redact_terms``, ``output_tokens``), checked;
    the options the import reads, or {} with field errors appended."""
    from apps.workloads.redaction import RedactionError, parse_rules

    out: dict[str, Any] = {}
    raw = data.get("redact")
    if raw in (None, "") or not _clean_text(raw, 100):
        errors.append(
            {
                "field": "redact",
                "message": "is required for openai-log: email, key, number (a comma list) or none",
            }
        )
    else:
        try:
            out["redact"] = [] if raw.strip() == "none" else parse_rules(raw)
        except RedactionError as exc:
            errors.append({"field": "redact", "message": str(exc)})
    terms_raw = data.get("redact_terms", "")
    if not _clean_text(terms_raw, MAX_REDACT_TERMS * (MAX_REDACT_TERM_CHARS + 2)):
        errors.append({"field": "redact_terms", "message": "must be text, one term a line"})
    else:
        terms = [t.strip() for t in terms_raw.splitlines() if t.strip()]
        if len(terms) > MAX_REDACT_TERMS or any(len(t) > MAX_REDACT_TERM_CHARS for t in terms):
            errors.append(
                {
                    "field": "redact_terms",
                    "message": f"at most {MAX_REDACT_TERMS} terms of at most {MAX_REDACT_TERM_CHARS} characters",
                }
            )
        elif terms:
            out["redact_terms"] = terms
    output_tokens = _number(
        data, "output_tokens", errors, integer=True, low=1, high=MAX_TOKENS, required=False
    )
    if output_tokens is not None:
        out["output_tokens"] = int(output_tokens)
    return out


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
