"""The token's own user: ``/api/v1/me/notifications``, what they are told and where
(apps/notifications). GET and PUT both need the read scope only: a PUT changes nothing but what
the token's own user is sent, and a viewer or an approver (who hold no run scope) choose theirs too."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.tokens import READ
from apps.api.base import ApiView
from apps.notifications.services import PreferenceError, preferences_get, preferences_set, webhook_names


def _body(user: Any) -> dict[str, Any]:
    return {"preferences": preferences_get(user=user), "webhooks": webhook_names()}


class MyNotifications(ApiView):
    scopes = {**ApiView.scopes, "PUT": READ}

    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        summary="What you are told: per kind, email on or off and the operator's webhooks by name",
        operation_id="me_notifications",
    )
    def get(self, request: Request) -> Response:
        return Response(_body(request.user))

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT},
        summary='Choose what you are told: {"preferences": {kind: {"email": bool, "webhooks": [name]}}}',
        operation_id="me_notifications_update",
    )
    def put(self, request: Request) -> Response:
        data = request.data
        choices = data.get("preferences") if isinstance(data, dict) else None
        try:
            preferences_set(user=request.user, choices=choices)
        except PreferenceError as exc:
            return Response(
                {"errors": [{"field": f"preferences.{exc.field}", "message": exc.message}]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        return Response(_body(request.user))
