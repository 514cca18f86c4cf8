from __future__ import annotations

from django.urls import path

from apps.runs import views

app_name = "runs"
urlpatterns = [
    path("runs/<uuid:run_id>/", views.run_detail, name="detail"),
    path("runs/<uuid:run_id>/run.json", views.run_export, name="export"),
]
