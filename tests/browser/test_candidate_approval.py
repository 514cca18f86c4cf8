"""An approved candidate in the browser: the manifest carries it as an overlay on B0.

The full journey (test_journey.py) runs a sweep on the CPU engine too short to prove a gain, so
its decision keeps B0. Here the decision is a real retune: the shipped results of two cells
(three repeats, enough for the run-level test) measured elsewhere (examples/results/, imported with ``results_import`` as a team would) make
the analysis propose C1. A second user approves C1 on the page (check 4 was not rehearsed, so
with a typed override), downloads both manifest files, and finds B0's record as it ran with C1
as an overlay beside it, whose digests match what the page shows.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from apps.approvals import manifest as mf
from apps.experiments.models import Experiment
from tests.browser.conftest import login, shot
from tests.experiments.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "results"


def test_an_approved_candidate_goes_into_the_manifest_as_an_overlay_on_b0(new_page, roles) -> None:  # type: ignore[no-untyped-def]
    UserFactory(username="erin", roles=["experimenter"])
    UserFactory(username="ada", roles=["approver"])
    call_command("experiment_import", str(EXAMPLE / "spec.yaml"), "--owner", "erin", stdout=io.StringIO())
    experiment = Experiment.objects.get(name="imported-results-example")
    call_command("results_import", "--experiment", str(experiment.pk), str(EXAMPLE), stdout=io.StringIO())
    experiment.refresh_from_db()
    assert (experiment.decision.outcome, experiment.decision.chosen_cell) == ("retune", "C1")

    ada = new_page()
    login(ada, "ada")
    ada.goto(f"/experiments/{experiment.pk}/approve/")
    ada.check("input[name=chosen_cell][value=C1]")
    ada.fill("#id_reason", "C1 proven on the imported runs")
    ada.fill("#id_deployment_revision", "helm-release-42")
    ada.fill("#id_route_target", "svc/llm-gateway")
    ada.fill("#id_recovery_override", "rollback rehearsed by hand on the production host")
    # The imported results ran no failure scenario for C1: check 3 says so and needs a reason.
    assert "not run" in ada.inner_text("#check-3")
    ada.fill("#id_scenarios_override", "scenarios run on the staging cluster, report attached to the change")
    ada.click("#do-approve")
    ada.wait_for_selector("#experiment-status")
    assert ada.inner_text("#experiment-status") == "approved"
    shot(ada, "c1-approved")

    ada.goto(f"/experiments/{experiment.pk}/results/")
    shown = {
        el.get_attribute("data-fmt"): el.inner_text()
        for el in ada.query_selector_all("#manifest-files .file-sha")
    }
    files = {}
    for fmt in ("json", "yaml"):
        response = ada.request.get(f"/experiments/{experiment.pk}/manifest.{fmt}")
        assert response.status == 200
        body = response.body()
        # What sha256sum of the download prints is what the page and the header say.
        assert hashlib.sha256(body).hexdigest() == shown[fmt] == response.headers["x-manifest-file-sha256"]
        files[fmt] = body
    doc = json.loads(files["json"])
    assert yaml.safe_load(files["yaml"]) == doc and mf.verify(doc)
    overlay = doc["overlay"]
    assert overlay["cell_id"] == "C1" and overlay["applies_to"] == "B0"
    assert overlay["changes"] == {"max_num_batched_tokens": {"baseline": 2048, "candidate": 512}}
    # The rollback target is B0's record as it ran, never merged with the overlay.
    assert doc["baseline"]["cell_id"] == "B0"
    assert doc["baseline"]["effective_args"]["args"]["max_num_batched_tokens"] == 2048
    assert doc["approval"]["chosen_cell"] == "C1"
    assert doc["evidence"]["decision"]["outcome"] == "retune"
    assert doc["evidence"]["failure_scenarios"]["check"] == "not run"
    assert doc["evidence"]["failure_scenarios"]["override_reason"].startswith("scenarios run on the staging")
