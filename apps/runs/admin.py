from __future__ import annotations

from django.contrib import admin

from apps.accounts.readonly import ReadOnlyAdmin
from apps.runs.models import Host, MetricSample, RequestRecord, Run


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "queue", "devices", "enabled", "last_heartbeat", "current_run")


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "experiment", "cell", "mixture", "rate_name", "repeat", "status", "host")
    list_filter = ("status",)


@admin.register(RequestRecord)
class RequestRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "run",
        "index",
        "request_class",
        "http_status",
        "output_tokens",
        "cancelled",
        "unfinished",
    )
    list_select_related = ("run",)


@admin.register(MetricSample)
class MetricSampleAdmin(ReadOnlyAdmin):
    list_display = ("run", "name", "phase", "epoch", "value", "taken_at")
