from __future__ import annotations

from django.urls import path

from apps.experiments import views

app_name = "experiments"
urlpatterns = [
    path("", views.experiment_list, name="list"),
]
