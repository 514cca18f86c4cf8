"""Approvals and the rollback manifest they freeze (the audit trail is apps/audit)."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from apps.approvals import manifest as mf


class Approval(models.Model):
    class Verdict(models.TextChoices):
        APPROVED = "approved"
        REJECTED = "rejected"

    experiment = models.OneToOneField(
        "experiments.Experiment", on_delete=models.CASCADE, related_name="approval"
    )
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approvals")
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    chosen_cell = models.CharField(max_length=32)
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.verdict} {self.chosen_cell} by {self.approver_id}"


class Revocation(models.Model):
    """An approval withdrawn: its manifest is superseded, its bytes and digest stay as approved."""

    approval = models.OneToOneField(Approval, on_delete=models.PROTECT, related_name="revocation")
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="revocations"
    )
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"revocation of {self.approval_id} by {self.revoked_by_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValidationError("a revocation is part of the record; it is never edited")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValidationError("a revocation is part of the record; it is never deleted")


class RollbackManifest(models.Model):
    """Baseline record plus the approved candidate as an overlay. Immutable once written."""

    experiment = models.OneToOneField(
        "experiments.Experiment", on_delete=models.CASCADE, related_name="manifest"
    )
    approval = models.OneToOneField(Approval, on_delete=models.PROTECT, related_name="manifest")
    content = models.JSONField()
    sha256 = models.CharField(max_length=64)  # of the content's canonical JSON (embedded in each file)
    # The files exactly as served, written once at approval: `sha256sum` of a download equals the
    # digest shown beside it, whatever a JSON column does to numbers on the way in and out.
    json_bytes = models.BinaryField(default=b"")
    yaml_bytes = models.BinaryField(default=b"")
    json_sha256 = models.CharField(max_length=64, blank=True, default="")
    yaml_sha256 = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"manifest {self.sha256[:12]}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValidationError(
                "an approved rollback manifest is immutable; start a new experiment instead"
            )
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValidationError("an approved rollback manifest is immutable")

    @property
    def superseded_by(self) -> Revocation | None:
        """The revocation of this manifest's approval, if it was revoked."""
        return Revocation.objects.filter(approval_id=self.approval_id).first()

    def file(self, fmt: str) -> tuple[bytes, str]:
        """(bytes, their sha256) of the YAML or JSON file; rows from before the stored files are
        rendered from the content (and hashed as served)."""
        stored = bytes(self.yaml_bytes if fmt == "yaml" else self.json_bytes)
        if not stored:
            stored = mf.render(mf.document(self.content, self.sha256), fmt)
        return stored, hashlib.sha256(stored).hexdigest()
