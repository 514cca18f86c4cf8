"""The audit trail: one call records who changed what, when."""

from __future__ import annotations

from typing import Any

from apps.approvals.models import AuditEvent


def audit_record(
    *,
    action: str,
    actor: Any = None,
    experiment: Any = None,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        action=action,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        experiment=experiment,
        target=target,
        detail=detail or {},
    )
