"""The runs resource of the REST API: one run's record, and its request records (paged JSON
or streamed JSONL)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound, ParseError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.roles import VIEWER
from apps.api.base import ApiView
from apps.runs.models import RequestRecord, Run
from apps.runs.selectors import run_record
from workers.replay.records import SCALAR_RECORD_FIELDS

MAX_PAGE_SIZE = 5000


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


def _positive(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        raise ParseError(
            {"errors": [{"field": name, "message": f"must be a positive whole number, got {raw!r}"}]}
        )
    return int(raw)
