from __future__ import annotations

from django.contrib import admin

from apps.accounts.readonly import ReadOnlyAdmin
from apps.approvals.models import Approval, Revocation, RollbackManifest


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("experiment", "verdict", "chosen_cell", "approver", "created_at")


@admin.register(Revocation)
class RevocationAdmin(ReadOnlyAdmin):
    list_display = ("approval", "revoked_by", "created_at")


@admin.register(RollbackManifest)
class RollbackManifestAdmin(ReadOnlyAdmin):
    list_display = ("experiment", "sha256", "created_at")
