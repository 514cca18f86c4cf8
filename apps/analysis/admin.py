from __future__ import annotations

from django.contrib import admin

from apps.accounts.readonly import ReadOnlyAdmin
from apps.analysis.models import Decision


@admin.register(Decision)
class DecisionAdmin(ReadOnlyAdmin):
    """Recomputed from the records, never edited, added or deleted by hand."""

    list_display = ("experiment", "outcome", "chosen_cell", "updated_at")
