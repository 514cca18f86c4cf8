"""A gate experiment's verdict is audited when the experiment is analysed (services.gate_verdict_record).

A receiver on the audit log: the analysis (apps/lifecycle, apps/analysis's import) sits below the
gate and cannot call it; its ``experiment.analysed`` row is where the gate learns of it."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from apps.audit.models import AuditEvent

log = logging.getLogger(__name__)


@receiver(post_save, sender=AuditEvent, dispatch_uid="gate.verdict_on_analysed")
def experiment_analysed(sender: Any, instance: AuditEvent, created: bool, **kwargs: Any) -> None:
    experiment = instance.experiment if created and instance.action == "experiment.analysed" else None
    if experiment is None:
        return
    from apps.gate.services import gate_verdict_record

    try:
        with transaction.atomic():  # a verdict that cannot be read never takes the analysis with it
            gate_verdict_record(experiment=experiment)
    except Exception:
        log.exception("could not record the gate verdict of experiment %s", instance.experiment_id)
