"""The audit log's receiver: every new audit row is looked at for a person to tell.

A receiver, not a call in each service: the events that need a person are written by several
apps (lifecycle, analysis's import, the gate), all through apps/audit, which sits below them all
and must not know about notifications."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from apps.audit.models import AuditEvent
from apps.notifications.services import notify_audit_event

log = logging.getLogger(__name__)


@receiver(post_save, sender=AuditEvent, dispatch_uid="notifications.audit_event")
def audit_event_saved(sender: Any, instance: AuditEvent, created: bool, **kwargs: Any) -> None:
    if not created:
        return
    try:
        # A savepoint: a notification that cannot be made never takes the audit row with it.
        with transaction.atomic():
            notify_audit_event(instance)
    except Exception:
        log.exception("could not make the notifications for audit event %s", instance.pk)
