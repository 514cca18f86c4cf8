from __future__ import annotations

from django.contrib import admin

from apps.analysis.models import Decision


@admin.register(Decision)
class DecisionAdmin(admin.ModelAdmin):
    list_display = ("experiment", "outcome", "chosen_cell", "updated_at")

    def has_change_permission(self, request, obj=None):
        return False  # recomputed from the records, never edited by hand
