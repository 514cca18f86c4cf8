from __future__ import annotations

from django.urls import path

from apps.history import views

app_name = "history"
urlpatterns = [
    path("compare/", views.compare_page, name="compare"),
    path("history/", views.history_page, name="route"),
]
