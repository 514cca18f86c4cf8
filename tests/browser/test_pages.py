"""The pages as a user sees them, without the run pipeline: create, errors, access, approve, manifest."""

from __future__ import annotations

import json

import pytest
import yaml

from apps.approvals import manifest as mf
from apps.experiments.models import Experiment
from tests.browser.conftest import login, shot
from tests.experiments.factories import UserFactory
from tests.ui.factories import analysed

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FORM = {
    "#id_name": "browser-small",
    "#id_model_path": ".engine/models/tiny-llama",
    "#id_model_revision": "r1",
    "#id_tokenizer_revision": "r1",
    "#id_baseline_captured_from": "prod chat, 2026-11-20",
    "#id_baseline_max_num_batched_tokens": "2048",
    "#id_baseline_max_num_seqs": "8",
    "#id_grid_max_num_batched_tokens": "512, 1024",
    "#id_grid_max_num_seqs": "8",
    "#id_rates": "low: 1.0",
    "#id_repeats": "1",
    "#id_seed": "7",
    "#id_warmup_s": "2",
    "#id_observation_s": "10",
    "#id_drain_deadline_s": "20",
    "#id_max_dispatch_lag_ms": "50",
}
CLASSES = [
    ["short", "64", "8", "0", "0", "2000", "5000", "1000", "0.05"],
    ["long", "1024", "8", "0", "0", "8000", "12000", "4000", "0.05"],
]
CLASS_FIELDS = [
    "name",
    "input_tokens",
    "output_tokens",
    "priority",
    "shared_prefix_tokens",
    "ttft_p99_ms",
    "e2e_p99_ms",
    "max_stall_ms",
    "error_rate",
]


def fill_create_form(page, *, mixtures: str, max_model_len: str) -> None:  # type: ignore[no-untyped-def]
    for selector, value in FORM.items():
        page.fill(selector, value)
    page.fill("#id_max_model_len", max_model_len)
    page.fill("#id_mixtures", mixtures)
    if page.locator("#id_classes-1-name").count() == 0:
        page.click("button[data-formset=classes-table]")  # formset.js adds the second row
    for row, values in enumerate(CLASSES):
        for field, value in zip(CLASS_FIELDS, values, strict=True):
            page.fill(f"#id_classes-{row}-{field}", value)


def test_it_creates_through_the_form_and_enforces_who_may_do_what(new_page, roles) -> None:  # type: ignore[no-untyped-def]
    UserFactory(username="erin", roles=["experimenter", "approver"])
    UserFactory(username="ada", roles=["approver"])
    UserFactory(username="vera", roles=["viewer"])

    # An experimenter starts from an empty list that says what to do next.
    erin = new_page()
    login(erin, "erin")
    assert "No experiments yet" in erin.inner_text("main")
    shot(erin, "01-list-empty")

    # Errors appear beside their fields, and nothing is saved.
    erin.click("text=New experiment")
    fill_create_form(erin, mixtures="80-20: short=0.8, long=0.3", max_model_len="")
    erin.click("button[name=preview]")
    assert "sum to 1" in erin.inner_text("#field-mixtures .errorlist")
    assert "required" in erin.inner_text("#field-max_model_len .errorlist")
    assert Experiment.objects.count() == 0
    shot(erin, "02-create-errors")

    # Fixed, the preview shows the plan size; Create saves and opens the experiment.
    fill_create_form(erin, mixtures="80-20: short=0.8, long=0.2", max_model_len="2048")
    erin.click("button[name=preview]")
    assert "3 runs" in erin.inner_text("#plan-estimate")
    assert "GPU-hours" in erin.inner_text("#plan-estimate")
    assert "80% power" in erin.inner_text("#planned-power")
    assert Experiment.objects.count() == 0
    shot(erin, "03-create-preview")
    erin.click("button[name=create]")
    erin.wait_for_selector("#run-table")
    experiment = Experiment.objects.get(name="browser-small")
    assert experiment.status == "planned"
    assert erin.locator("#run-table tbody tr").count() == 3
    assert erin.locator("#start").count() == 1
    # Where the rates came from, and the goodput form that spends engine time, for the author.
    assert "typed by hand" in erin.inner_text("#rates-source")
    assert erin.locator("#rates-table tbody tr").count() == len(experiment.workload.mixtures)
    assert "costs up to" in erin.inner_text("#goodput-form")
    shot(erin, "04-experiment-planned")

    # Results (seeded here: the run pipeline is not part of this test).
    analysed(experiment)
    decision = experiment.decision
    erin.goto(f"/experiments/{experiment.pk}/results/")
    assert decision.outcome in erin.inner_text("#decision")
    assert "family-wise" in erin.inner_text("#statistics")
    # The evidence is collapsed and plotly.js not loaded until a part with charts is opened.
    assert erin.locator(".chart .main-svg").count() == 0
    assert erin.evaluate("typeof Plotly") == "undefined"
    for part in ("by-cell", "goodput", "server"):
        erin.click(f"#{part} > summary")
    erin.wait_for_selector("div[data-chart='latency-ttft'] .main-svg")
    erin.wait_for_selector("div[data-chart='queue-over-time'] .main-svg")
    assert erin.locator(".chart .main-svg").count() >= 6
    shot(erin, "05-results")

    # The author cannot approve their own experiment, even holding the approver role.
    response = erin.goto(f"/experiments/{experiment.pk}/approve/")
    assert response.status == 403
    assert "author" in erin.inner_text("main")
    shot(erin, "06-author-cannot-approve")

    # A viewer reads but cannot create.
    vera = new_page()
    login(vera, "vera")
    assert vera.locator("text=New experiment").count() == 0
    response = vera.goto("/experiments/new/")
    assert response.status == 403
    shot(vera, "07-viewer-cannot-create")

    # An approver approves the proposal and downloads the manifest.
    ada = new_page()
    login(ada, "ada")
    ada.goto(f"/experiments/{experiment.pk}/approve/")
    shot(ada, "08-approve")
    ada.check(f"input[name=chosen_cell][value={decision.chosen_cell}]")
    ada.fill("#id_reason", "C-cells keep every contract with lower TTFT")
    ada.fill("#id_deployment_revision", "helm-release-42")
    ada.fill("#id_route_target", "svc/llm-gateway")
    # Typed in case the proposal is a candidate with unproven checks 3 and 4 (ignored otherwise).
    ada.fill("#id_scenarios_override", "pages: scenarios reviewed")
    ada.fill("#id_recovery_override", "pages: rollback reviewed")
    ada.click("#do-approve")
    ada.wait_for_selector("#experiment-status")
    assert ada.inner_text("#experiment-status") == "approved"
    shot(ada, "09-approved")
    doc = json.loads(ada.request.get(f"/experiments/{experiment.pk}/manifest.json").text())
    assert mf.verify(doc)
    assert doc["baseline"]["cell_id"] == "B0"
    assert doc["baseline"]["effective_args"]["args"]["max_num_batched_tokens"] == 2048
    assert doc["evidence"]["experiment"]["id"] == experiment.pk
    assert doc["evidence"]["decision"]["outcome"] == decision.outcome
    if decision.chosen_cell != "B0":
        assert doc["overlay"]["cell_id"] == decision.chosen_cell
    as_yaml = yaml.safe_load(ada.request.get(f"/experiments/{experiment.pk}/manifest.yaml").text())
    assert as_yaml == doc

    run = experiment.runs.order_by("plan_position").first()
    ada.goto(f"/runs/{run.run_id}/")
    ada.wait_for_selector("div[data-chart='run-ttft'] .main-svg")
    shot(ada, "10-run")
    ada.goto("/audit/")
    assert "experiment.approved" in ada.inner_text("#audit")
    shot(ada, "11-audit")
