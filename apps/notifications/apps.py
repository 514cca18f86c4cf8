from __future__ import annotations

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "apps.notifications"
    label = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The audit log's post_save receiver: every recorded event is looked at once.
        from apps.notifications import receivers  # noqa: F401
