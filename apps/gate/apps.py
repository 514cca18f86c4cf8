from django.apps import AppConfig


class GateConfig(AppConfig):
    name = "apps.gate"
    label = "gate"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.gate import receivers  # noqa: F401
