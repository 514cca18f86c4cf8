"""What each user wants to be told (NotificationPreference) and what was sent (Notification)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.notifications.events import KINDS


class NotificationPreference(models.Model):
    """One user's choice for one kind of event: email or not, and which operator webhooks.

    A webhook is a name from the operator's ``TAILTUNE_WEBHOOKS``, never a URL: a user picks
    where among the places the operator allowed, and cannot make the server call anywhere else.
    No row: email on, no webhook (services.DEFAULT_EMAIL)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32, choices=list(KINDS.items()))
    email = models.BooleanField(default=True)
    webhooks = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "kind"], name="uniq_preference_per_kind")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.kind}"


class Notification(models.Model):
    """One message to one user on one channel, and every attempt to deliver it."""

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"  # every attempt failed

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32, choices=list(KINDS.items()))
    event = models.ForeignKey("audit.AuditEvent", null=True, on_delete=models.SET_NULL, related_name="+")
    experiment = models.ForeignKey(
        "experiments.Experiment", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    channel = models.CharField(max_length=16, choices=Channel.choices)
    # The email address, or the webhook's name (its URL is the operator's, read when sending).
    target = models.CharField(max_length=254)
    subject = models.CharField(max_length=300)
    payload = models.JSONField(default=dict)  # exactly what is sent (the webhook's JSON body)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    # Every attempt: {"at": ISO time, "ok": bool, "error": str, "status_code": int | None}.
    attempt_log = models.JSONField(default=list, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One audit event tells a user once per channel and target, however often it is seen.
            models.UniqueConstraint(
                fields=["event", "user", "kind", "channel", "target"], name="uniq_notification_per_event"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.target} ({self.status})"
