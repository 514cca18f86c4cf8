from django.urls import path
from drf_spectacular.views import SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny

from apps.api import (
    gates,
    schema,
    views,
    views_capture,
    views_history,
    views_hosts,
    views_me,
    views_runs,
    views_traces,
)

app_name = "api"
OPEN = {"authentication_classes": [], "permission_classes": [AllowAny]}

urlpatterns = [
    # The document and its browsable docs are public: they describe the API, they hold no data.
    # The docs' script is a file of its own (?script), as the Content-Security-Policy asks.
    # Each format has its own URL, so a plain GET (curl, generators) gets what the name says.
    path("openapi.json", schema.OpenApiJSON.as_view(**OPEN), name="openapi"),
    path("openapi.yaml", schema.OpenApiYAML.as_view(**OPEN), name="openapi-yaml"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:openapi", **OPEN), name="docs"),
    path("experiments", views.ExperimentList.as_view(), name="experiments"),
    path("experiments/<int:pk>", views.ExperimentDetail.as_view(), name="experiment"),
    path("experiments/<int:pk>/start", views.ExperimentStart.as_view(), name="start"),
    path("experiments/<int:pk>/cancel", views.ExperimentCancel.as_view(), name="cancel"),
    path("experiments/<int:pk>/report", views.ExperimentReport.as_view(), name="report"),
    path("experiments/<int:pk>/approve", views.ExperimentApprove.as_view(), name="approve"),
    path("experiments/<int:pk>/revoke", views.ExperimentRevoke.as_view(), name="revoke"),
    path("experiments/<int:pk>/bundle", views.ExperimentBundle.as_view(), name="bundle"),
    path("experiments/<int:pk>/manifest.<str:fmt>", views.ExperimentManifest.as_view(), name="manifest"),
    path("compare", views_history.Compare.as_view(), name="compare"),
    path("history", views_history.RouteHistory.as_view(), name="history"),
    path("me/notifications", views_me.MyNotifications.as_view(), name="me-notifications"),
    path("hosts/offers", views_hosts.HostOffers.as_view(), name="host-offers"),
    path("baselines/capture", views_capture.BaselineCapture.as_view(), name="baseline-capture"),
    path("runs/<str:run_id>", views_runs.RunDetail.as_view(), name="run"),
    path("runs/<str:run_id>/records", views_runs.RunRecords.as_view(), name="records"),
    path("traces", views_traces.TraceUpload.as_view(), name="traces"),
    path("traces/uploads/<int:pk>", views_traces.TraceUploadDetail.as_view(), name="trace-upload"),
    path("gates", gates.GateCreate.as_view(), name="gates"),
    path("gates/<int:pk>", gates.GateVerdict.as_view(), name="gate"),
    path("gates/uploads/<int:pk>", gates.GateUploadDetail.as_view(), name="gate-upload"),
    # The remote client is code, not data: public like the OpenAPI document.
    path("gate-client.py", gates.GateClient.as_view(), name="gate-client"),
]
