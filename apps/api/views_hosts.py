"""The hosts' offers resource of the REST API: the switch and router names a spec's
``recovery.switch`` / ``recovery.router`` may pick (apps/experiments/offers.py). Names only:
the commands and URLs behind them are the operator's and stay on the hosts."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ParseError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.roles import VIEWER
from apps.api.base import ApiView
from apps.experiments.offers import offers_for

_TOKENS = re.compile(r"[0-9]{1,9}")

OFFERS = inline_serializer(
    "HostOffers",
    {
        "switches": serializers.ListField(child=serializers.CharField()),
        "routers": serializers.ListField(child=serializers.CharField()),
        "hosts": serializers.ListField(child=serializers.DictField()),
    },
)


class HostOffers(ApiView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "max_model_len",
                int,
                description="only the hosts that serve this context length (the spec's controls.max_model_len)",
            )
        ],
        responses={200: OFFERS},
        summary="The switch and router names (recovery.switch, recovery.router) the enabled hosts offer",
        operation_id="hosts_offers",
    )
    def get(self, request: Request) -> Any:
        self.need(VIEWER)
        raw = request.query_params.get("max_model_len", "")
        if raw and not _TOKENS.fullmatch(raw):
            raise ParseError({"max_model_len": "must be a whole number of tokens"})
        return Response(offers_for(max_model_len=int(raw) if raw else None).as_json())
