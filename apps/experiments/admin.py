from __future__ import annotations

from django.contrib import admin

from apps.accounts.readonly import ReadOnlyAdmin
from apps.experiments.models import Experiment, RequestClass, ServerConfig, Workload


class ReadOnlyInline(admin.TabularInline):
    extra = 0

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ServerConfigInline(ReadOnlyInline):
    model = ServerConfig


class RequestClassInline(ReadOnlyInline):
    model = RequestClass


# Experiments are evidence: the admin reads them, superusers included. Owners, cells, classes
# and workloads change only through the audited services, never by hand here (an owner edited
# here could approve their own experiment).
@admin.register(Experiment)
class ExperimentAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "owner", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("name",)
    inlines = [ServerConfigInline, RequestClassInline]


@admin.register(Workload)
class WorkloadAdmin(ReadOnlyAdmin):
    list_display = ("experiment", "arrival_process", "repeats", "seed")
