from __future__ import annotations

from django.contrib import admin

from apps.experiments.models import Experiment, RequestClass, ServerConfig, Workload


class ServerConfigInline(admin.TabularInline):
    model = ServerConfig
    extra = 0


class RequestClassInline(admin.TabularInline):
    model = RequestClass
    extra = 0


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("name",)
    inlines = [ServerConfigInline, RequestClassInline]


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin):
    list_display = ("experiment", "arrival_process", "repeats", "seed")
