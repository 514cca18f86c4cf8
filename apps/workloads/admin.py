from __future__ import annotations

from django.contrib import admin

from apps.workloads.models import Corpus, Trace


@admin.register(Trace)
class TraceAdmin(admin.ModelAdmin):
    list_display = ("sha256", "kind", "label", "requests", "duration_s", "created_at")
    exclude = ("content_gz",)

    def has_change_permission(self, request, obj=None):
        return False  # a frozen trace never changes: its hash names it


@admin.register(Corpus)
class CorpusAdmin(admin.ModelAdmin):
    list_display = ("sha256", "source", "label", "entries", "created_at")
    exclude = ("content_gz",)

    def has_change_permission(self, request, obj=None):
        return False  # a stored corpus never changes: its hash names it
