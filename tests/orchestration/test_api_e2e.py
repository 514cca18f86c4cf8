"""The whole life of an experiment through the REST API only, on the CPU engine with a real worker."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from tests.engine_support import ENGINE_MARKS
from tests.experiments.factories import SMALL_SPEC, UserFactory
from tests.orchestration.conftest import Workers
from tests.waiting import wait_for

pytestmark = [*ENGINE_MARKS, pytest.mark.django_db(transaction=True)]


def _api(user, name: str) -> APIClient:  # type: ignore[no-untyped-def]
    _, plaintext = token_create(user=user, name=name)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api


def test_create_start_wait_report_approve_and_fetch_the_manifest_through_the_api(
    workers: Workers, roles: None
) -> None:
    workers.start()
    author = _api(UserFactory(username="ci-author", roles=["experimenter"]), "ci")
    approver = _api(UserFactory(username="ci-approver", roles=["approver"]), "release")
    spec = copy.deepcopy(SMALL_SPEC)
    spec["name"] = "via the api"
    created = author.post("/api/v1/experiments", spec, format="json")
    assert created.status_code == 201, created.content
    pk = created.json()["id"]
    assert author.post(f"/api/v1/experiments/{pk}/start").status_code == 202

    state: dict[str, Any] = {}

    def settled() -> bool:
        state.update(author.get(f"/api/v1/experiments/{pk}").json())
        return state["status"] in ("analysed", "cancelled", "planned")

    wait_for(settled, 900, interval_s=3, what=lambda: f"experiment {pk} settled: {state}\n{workers.logs()}")
    assert state["status"] == "analysed", (state, workers.logs())
    report = author.get(f"/api/v1/experiments/{pk}/report").json()
    decision = report["decision"]
    assert decision["outcome"] == state["decision"]["outcome"]

    chosen = decision["chosen_cell"] or "B0"
    body = {
        "chosen_cell": chosen,
        "reason": "approved through the API",
        "deployment_revision": "helm-release-42",
        "route_target": "svc/llm-gateway",
    }
    if report["checks"]["recovery"]["status"] in ("fail", "pending", "not rehearsed"):
        body["recovery_override"] = "CPU test machine: the rehearsal is read, not gated, here"
    if chosen != report["baseline"]:
        # This experiment runs no failure scenario: approving a candidate needs a check 3 reason.
        body["scenarios_override"] = "CPU test machine: no failure scenarios in this spec"
    assert author.post(f"/api/v1/experiments/{pk}/approve", body, format="json").status_code == 403
    approved = approver.post(f"/api/v1/experiments/{pk}/approve", body, format="json")
    assert approved.status_code == 201, approved.content
    manifest = approver.get(f"/api/v1/experiments/{pk}/manifest.yaml")
    assert manifest.status_code == 200
    assert hashlib.sha256(manifest.content).hexdigest() == manifest["X-Manifest-File-Sha256"]
    assert author.get(f"/api/v1/experiments/{pk}").json()["status"] == "approved"
