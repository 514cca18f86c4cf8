"""The runs resource of the REST API: one run's record, and its request records (paged JSON
or streamed JSONL)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ParseError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.roles import VIEWER
from apps.api.base import ApiView
from apps.runs.models import RequestRecord, Run
from apps.runs.record_names import CELL_ALIAS, WINDOW_ALIAS
from apps.runs.selectors import run_record
from workers.replay.records import SCALAR_RECORD_FIELDS

MAX_PAGE_SIZE = 5000


@extend_schema_serializer(deprecate_fields=[CELL_ALIAS, WINDOW_ALIAS])
class RunRecordSerializer(serializers.Serializer):
    """The run record under the method's names (apps/runs/record_names.py, docs/SPEC.md "The run
    record"); for the OpenAPI document only: the view answers apps/runs/selectors.run_record."""

    run_id = serializers.UUIDField()
    cell_id = serializers.CharField()
    mixture = serializers.CharField()
    rate = serializers.CharField(help_text="the rate's name")
    rate_rps = serializers.FloatField()
    repeat = serializers.IntegerField()
    position = serializers.IntegerField(help_text="position in its repeat round")
    scenario = serializers.CharField(help_text="empty for a sweep run")
    status = serializers.CharField()
    trace_sha256 = serializers.CharField()
    corpus_sha256 = serializers.CharField()
    image_digest = serializers.CharField()
    vllm_version = serializers.CharField()
    model_revision = serializers.CharField()
    tokenizer_revision = serializers.CharField()
    hardware_id = serializers.CharField()
    effective_args = serializers.DictField(allow_null=True, help_text="what the engine confirmed")
    generation = serializers.DictField(allow_null=True)
    dispatch_lag_p99_ms = serializers.FloatField(allow_null=True)
    warmup_seconds = serializers.FloatField()
    observation_seconds = serializers.FloatField()
    drain_deadline_seconds = serializers.FloatField()
    experiment = serializers.IntegerField()
    reason = serializers.CharField()
    attempts = serializers.IntegerField()
    retry_of = serializers.UUIDField(allow_null=True)
    host = serializers.CharField(allow_null=True)
    requests_planned = serializers.IntegerField(allow_null=True)
    requests_sent = serializers.IntegerField()
    dispatch_lag_p50_ms = serializers.FloatField(allow_null=True)
    dispatch_lag_max_ms = serializers.FloatField(allow_null=True)
    loop_stall_max_ms = serializers.FloatField(allow_null=True)
    send_priority = serializers.CharField(allow_null=True)
    achieved_rate_rps = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    summary = serializers.DictField(allow_null=True)
    records_url = serializers.CharField()
    cell = serializers.CharField(help_text="older name of cell_id")
    window = serializers.DictField(
        help_text="older names of the windows: warmup_s, observation_s, drain_deadline_s"
    )


class RunDetail(ApiView):
    @extend_schema(
        responses={200: RunRecordSerializer},
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
        # ``run`` is the older name of ``run_id``, kept for consumers of the earlier export.
        return Response(
            {
                "run_id": str(run.run_id),
                "run": str(run.run_id),
                "count": total,
                "page": page,
                "page_size": size,
                "records": items,
            }
        )


def _uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _positive(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        raise ParseError(
            {"errors": [{"field": name, "message": f"must be a positive whole number, got {raw!r}"}]}
        )
    return int(raw)
