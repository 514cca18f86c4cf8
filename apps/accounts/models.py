"""API tokens (apps/accounts/tokens.py): per user, stored as a digest, scoped, revocable, expiring."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # SHA-256 of the token's secret part; the plaintext is shown once and never stored.
    digest = models.CharField(max_length=64)
    # What the token may do: some of "read", "run", "approve" (tokens.SCOPES); its user's roles
    # still bound it, so the rights are these AND the user's roles at the time of each request.
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    # Every token expires: at most TAILTUNE_TOKEN_DAYS after its creation.
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.user} / {self.name}"

    @property
    def live(self) -> bool:
        return self.status == "live"

    @property
    def status(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "live"
