"""The audit trail: one row for every state change, whichever app made it."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """Who changed what, when: one row for every state change."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    experiment = models.ForeignKey(
        "experiments.Experiment",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_events",
    )
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=200, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        # The table approvals created before the audit log had an app of its own (#33): the
        # model moved, its rows did not.
        db_table = "approvals_auditevent"
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.action} {self.target}"
