from __future__ import annotations

from django.apps import AppConfig


class WorkloadsConfig(AppConfig):
    name = "apps.workloads"
    label = "workloads"
