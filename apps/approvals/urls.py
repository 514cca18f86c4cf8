from __future__ import annotations

from django.urls import path

from apps.approvals import views

app_name = "approvals"
urlpatterns = [
    path("experiments/<int:pk>/approve/", views.experiment_approve_page, name="approve"),
    path("experiments/<int:pk>/revoke/", views.approval_revoke_page, name="revoke"),
    path("experiments/<int:pk>/manifest.<str:fmt>", views.manifest_download, name="manifest"),
    path("experiments/<int:pk>/review-bundle.html", views.review_bundle, name="bundle"),
    path("experiments/<int:pk>/audit/", views.experiment_audit, name="experiment_audit"),
    path("audit/", views.audit_log, name="audit"),
]
