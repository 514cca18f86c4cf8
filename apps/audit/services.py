"""The audit trail: one call records who changed what, when."""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any

from apps.audit.models import AuditEvent

# The API token a request acts through (apps/api/base.py binds it per request): every audit
# event written meanwhile names it, so a change made by a CI job says which token made it.
_via_token: ContextVar[str | None] = ContextVar("tailtune_via_token", default=None)


def bind_token(name: str | None) -> Token[str | None]:
    return _via_token.set(name)


def unbind_token(token: Token[str | None]) -> None:
    _via_token.reset(token)


def audit_record(
    *,
    action: str,
    actor: Any = None,
    experiment: Any = None,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    detail = dict(detail or {})
    via = _via_token.get()
    if via is not None:
        detail.setdefault("api_token", via)
    return AuditEvent.objects.create(
        action=action,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        experiment=experiment,
        target=target,
        detail=detail,
    )
