from __future__ import annotations

from django.contrib import admin

from apps.accounts.readonly import ReadOnlyAdmin
from apps.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "experiment", "action", "target")
    list_filter = ("action",)
