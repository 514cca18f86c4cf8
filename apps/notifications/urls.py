from __future__ import annotations

from django.urls import path

from apps.notifications import views

app_name = "notifications"
urlpatterns = [
    path("notifications/", views.preferences_page, name="preferences"),
    path("notifications/save", views.preferences_save, name="save"),
]
