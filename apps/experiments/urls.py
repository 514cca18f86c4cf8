from __future__ import annotations

from django.urls import path

from apps.experiments import views

app_name = "experiments"
urlpatterns = [
    path("", views.experiment_list, name="list"),
    path("experiments/new/", views.experiment_new, name="new"),
    path("experiments/uploads/<int:pk>/", views.upload_detail, name="upload"),
    path("experiments/<int:pk>/", views.experiment_detail, name="detail"),
    path("experiments/<int:pk>/live/", views.experiment_live, name="live"),
    path("experiments/<int:pk>/progress.json", views.experiment_progress_json, name="progress"),
    path("experiments/<int:pk>/start/", views.experiment_start, name="start"),
    path("experiments/<int:pk>/cancel/", views.experiment_cancel, name="cancel"),
    path("experiments/<int:pk>/rehearse/", views.experiment_rehearse, name="rehearse"),
    path("experiments/<int:pk>/goodput/", views.experiment_goodput, name="goodput"),
    path("experiments/<int:pk>/results/", views.experiment_results, name="results"),
    path("experiments/<int:pk>/spec.yaml", views.experiment_spec, name="spec"),
]
