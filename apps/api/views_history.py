"""Across experiments on the REST API: two compared side by side, and a route target's history
(the same answers as /compare/ and /history/, apps/history)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.roles import VIEWER
from apps.api.base import ApiView
from apps.history.views import comparison, history
from config.params import BadValue


class Compare(ApiView):
    @extend_schema(
        parameters=[
            OpenApiParameter("a", int, required=True, description="an analysed experiment"),
            OpenApiParameter("b", int, required=True, description="another (or the same, with another cell)"),
            OpenApiParameter("a_cell", str, description="a's cell (default: its decision's choice, else B0)"),
            OpenApiParameter("b_cell", str, description="b's cell"),
        ],
        responses={200: OpenApiTypes.OBJECT, 409: OpenApiTypes.OBJECT},
        summary="Two experiments' cells side by side on the metrics they share; 409 with the reasons "
        "when they cannot be compared (different traces, hardware, model or tokenizer revisions)",
        operation_id="compare",
    )
    def get(self, request: Request) -> Response:
        self.need(VIEWER)
        for name in ("a", "b"):
            if not request.query_params.get(name):
                raise ParseError({name: "is required: an experiment id"})
        try:
            result = comparison(request.query_params)
        except BadValue as exc:
            raise ParseError({exc.field: exc.message}) from None
        code = status.HTTP_200_OK if result["comparable"] else status.HTTP_409_CONFLICT
        return Response(result, status=code)


def _event(e: Any) -> dict[str, Any]:
    return {
        "at": e.at.isoformat(),
        "kind": e.kind,
        "experiment": e.experiment_id,
        "experiment_name": e.experiment_name,
        "cell": e.cell,
        "by": e.who or None,
        "text": e.text,
        "metrics": dict(e.metrics),
        "candidate_metrics": dict(e.candidate_metrics),
        "live": dict(e.live),
        "live_from": e.live_from,
    }


class RouteHistory(ApiView):
    @extend_schema(
        parameters=[
            OpenApiParameter("route", str, description="a route target, exactly as approvals named it"),
            OpenApiParameter("deployment", str, description="or a deployment revision"),
        ],
        responses={200: OpenApiTypes.OBJECT},
        summary="Every approval, revocation and gate verdict of a route target, oldest first, with "
        "each class's primary metric for the config live after it",
        operation_id="history",
    )
    def get(self, request: Request) -> Response:
        self.need(VIEWER)
        if not (request.query_params.get("route") or request.query_params.get("deployment")):
            raise ParseError({"route": "give a route target (or deployment: a deployment revision)"})
        try:
            found = history(request.query_params)
        except BadValue as exc:
            raise ParseError({exc.field: exc.message}) from None
        return Response(
            {
                "route": found["route"] or None,
                "deployment": found["deployment"] or None,
                "events": [_event(e) for e in found["events"]],
            }
        )
