"""The whole journey as a new user would make it, on the real pipeline (CPU vLLM, short windows).

Log in as an experimenter, create a small experiment through the form, start
it, watch progress change without reloading, see results and a decision
appear; log in as an approver, approve, download the manifest and check it
against the experiment; the author cannot approve and a viewer cannot create.

It needs what the pipeline needs: the CPU engine (`make engine`) and a worker
process that shares the test database (Postgres, or the file-backed SQLite
test database). Anything missing is a skip with its reason.
On a machine where other workers share the embedded broker, give the run
its own TAILTUNE_DATA, or another worker may take its analysis task:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_ui SECRET_KEY=x \
    TAILTUNE_DATA=$(mktemp -d) .venv/bin/pytest tests/browser/test_journey.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from django.conf import settings
from django.db import connection
from playwright.sync_api import expect

from apps.approvals import manifest as mf
from apps.experiments.models import Experiment
from apps.runs.hosts import hosts_alive
from tests.browser.conftest import login, shot
from tests.browser.test_pages import CLASS_FIELDS
from tests.engine_support import MODEL, engine_missing
from tests.experiments.factories import UserFactory
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.engine, pytest.mark.django_db(transaction=True)]

# The worker's host: this process's own, so no other test's worker can pass for it.
HOST = f"journey-{os.getpid()}"
RUNS_TIMEOUT_MS = 15 * 60 * 1000  # two short runs on two shared cores, server start included
ANALYSIS_TIMEOUT_S = 5 * 60


def _missing() -> str | None:
    missing = engine_missing()
    if missing:
        return missing
    if _worker_database_url() is None:
        return "the worker process must share the test database: Postgres, or SQLite in a file"
    return None


def _worker_database_url() -> str | None:
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    name = str(db["NAME"])
    if connection.vendor == "sqlite" and "memory" not in name and name.startswith("/"):
        return f"sqlite:///{name}"
    return None


@pytest.fixture
def worker(roles, tmp_path):  # type: ignore[no-untyped-def]
    """A real host worker (its own process) on the live test database."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ)
    env["DATABASE_URL"] = str(_worker_database_url())
    env.setdefault("SECRET_KEY", "journey")
    env["TAILTUNE_HOST"] = HOST
    # Its own default queue: a task another test left on the shared broker is never its to take.
    env["TAILTUNE_DEFAULT_QUEUE"] = f"journey-default-{os.getpid()}"
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "run_worker"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_it_runs_the_whole_journey_in_the_browser(new_page, worker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    UserFactory(username="erin", roles=["experimenter", "approver"])
    UserFactory(username="ada", roles=["approver"])
    UserFactory(username="vera", roles=["viewer"])
    revision = json.loads((MODEL / "tailtune-revision.json").read_text()).get(
        "revision", "tiny-llama-local-v1"
    )

    erin = new_page()
    login(erin, "erin")
    erin.click("text=New experiment")
    values = {
        "#id_name": "journey",
        "#id_model_path": str(MODEL),
        "#id_model_revision": revision,
        "#id_tokenizer_revision": revision,
        "#id_dtype": "bfloat16",
        "#id_max_model_len": "1024",
        "#id_kv_cache_memory_bytes": str(16 * 1024 * 1024),
        "#id_generation": "{temperature: 0.0, ignore_eos: true}",
        "#id_baseline_captured_from": "journey test",
        "#id_baseline_max_num_batched_tokens": "1024",
        "#id_baseline_max_num_seqs": "8",
        "#id_grid_max_num_batched_tokens": "256",
        "#id_grid_max_num_seqs": "8",
        "#id_mixtures": "mix: short=0.8, long=0.2",
        "#id_rates": "low: 2.0",
        "#id_repeats": "1",
        "#id_seed": "11",
        "#id_warmup_s": "2",
        "#id_observation_s": "8",
        "#id_drain_deadline_s": "30",
        "#id_max_dispatch_lag_ms": "2000",  # shared CPU: this test checks the pages, not timing
    }
    for selector, value in values.items():
        erin.fill(selector, value)
    erin.click("button[data-formset=classes-table]")
    classes = [
        ["short", "32", "4", "0", "0", "20000", "60000", "20000", "0.5"],
        ["long", "256", "4", "0", "0", "40000", "90000", "20000", "0.5"],
    ]
    for row, row_values in enumerate(classes):
        for field, value in zip(CLASS_FIELDS, row_values, strict=True):
            erin.fill(f"#id_classes-{row}-{field}", value)
    erin.click("button[name=preview]")
    assert "2 runs" in erin.inner_text("#plan-estimate")
    erin.click("button[name=create]")
    erin.wait_for_selector("#start")
    experiment = Experiment.objects.get(name="journey")

    # The worker registers its host with a heartbeat; start once it is there (a Start with no host
    # would leave the experiment waiting for one, and the test would only time out much later).
    def host_ready() -> bool:
        return HOST in [h.name for h in hosts_alive(max_model_len=experiment.max_model_len)]

    log = tmp_path / "worker.log"
    wait_for(
        host_ready,
        120,
        interval_s=1,
        what=lambda: f"host {HOST} alive; its worker said:\n{log.read_text()[-3000:]}",
    )
    erin.click("#start")
    erin.wait_for_selector("#live[data-live-url]")
    shot(erin, "j1-started")

    # Progress changes in place: the page is never reloaded.
    erin.evaluate("window.__journeyMarker = 42")
    erin.wait_for_selector(".current-run", timeout=RUNS_TIMEOUT_MS)  # a run's live view appears
    shot(erin, "j1b-live-run")
    # Waited for by Playwright's own locator (wait_for_function would eval the predicate in the page,
    # which the Content-Security-Policy refuses, as it should).
    expect(erin.locator("#progress-text")).to_have_text(
        re.compile(r"^\s*2\s*/\s*2"), use_inner_text=True, timeout=RUNS_TIMEOUT_MS
    )
    assert erin.evaluate("window.__journeyMarker") == 42
    shot(erin, "j2-runs-finished")

    wait_for(
        lambda: Experiment.objects.get(pk=experiment.pk).status == "analysed",
        ANALYSIS_TIMEOUT_S,
        interval_s=3,
        what=lambda: f"analysed (status reason: {Experiment.objects.get(pk=experiment.pk).status_reason})",
    )
    experiment.refresh_from_db()
    # The open experiment page turns analysed by itself: badge, decision, a link to the results,
    # without a navigation (the marker set before the runs survives).
    erin.wait_for_selector("#experiment-status.status-analysed", timeout=30_000)
    assert erin.evaluate("window.__journeyMarker") == 42
    assert erin.query_selector("#cancel") is None
    shot(erin, "j2b-analysed-in-place")
    erin.goto(f"/experiments/{experiment.pk}/results/")
    decision = experiment.decision
    assert decision.outcome in erin.inner_text("#decision")
    shot(erin, "j3-results")

    # The rollback rehearsal: queued after the analysis when the decision proposes C1, else
    # started from the results page, which states its engine time first. Its timeline chart
    # (per-second TTFT p99 per class, B0's queue and KV, the switch and the deadline) follows.
    if "C1" not in (decision.report.get("rehearsals") or {}):
        erin.goto(f"/experiments/{experiment.pk}/results/#rehearsal")  # the anchor opens its part
        assert "s of engine time" in erin.inner_text("#rehearse-form")
        erin.select_option("#rehearse-form select[name=cell]", "C1")
        erin.click("#rehearse-form button[type=submit]")
        erin.wait_for_selector("#experiment-status")
        wait_for(
            lambda: (
                Experiment.objects.get(pk=experiment.pk).status == "analysed"
                and experiment.runs.filter(
                    kind="rehearsal", status__in=["done", "failed", "invalid"]
                ).exists()
            ),
            RUNS_TIMEOUT_MS / 1000,
            interval_s=3,
            what=lambda: (
                "the rehearsal ended and the experiment analysed: "
                f"{list(experiment.runs.filter(kind='rehearsal').values_list('status', 'reason'))}, "
                f"{Experiment.objects.get(pk=experiment.pk).status_reason}"
            ),
        )
        experiment.refresh_from_db()
    rehearsal = experiment.runs.get(kind="rehearsal")
    assert rehearsal.status == "done", (rehearsal.reason, rehearsal.log_tail[-2000:])
    assert experiment.status == "analysed", experiment.status_reason
    erin.goto(f"/experiments/{experiment.pk}/results/#rehearsal")
    erin.wait_for_selector("[data-chart=rehearsal-timeline-C1] .main-svg")
    figure = json.loads(erin.inner_text("#rehearsal-timeline-C1"))
    names = {trace["name"] for trace in figure["data"]}
    assert {"short TTFT p99", "long TTFT p99"} <= names, names
    assert [shape["x0"] for shape in figure["layout"]["shapes"]] == [6.0, 6.0 + 30]  # switch, deadline
    assert "Recovery (check 4)" in erin.inner_text("#check-4")
    shot(erin, "j3b-rehearsal")
    assert erin.goto(f"/experiments/{experiment.pk}/approve/").status == 403  # the author

    vera = new_page()
    login(vera, "vera")
    assert vera.goto("/experiments/new/").status == 403

    ada = new_page()
    login(ada, "ada")
    ada.goto(f"/experiments/{experiment.pk}/approve/")
    ada.check(f"input[name=chosen_cell][value={decision.chosen_cell or 'B0'}]")
    ada.fill("#id_reason", "journey approval")
    ada.fill("#id_deployment_revision", "helm-release-42")
    ada.fill("#id_route_target", "svc/llm-gateway")
    # A rehearsal that did not pass on this shared CPU needs a typed override to approve C1.
    ada.fill("#id_recovery_override", "journey: rehearsal reviewed")
    ada.fill("#id_scenarios_override", "journey: failure scenarios reviewed")
    ada.click("#do-approve")
    ada.wait_for_selector("#experiment-status")
    assert ada.inner_text("#experiment-status") == "approved"
    doc = json.loads(ada.request.get(f"/experiments/{experiment.pk}/manifest.json").text())
    assert yaml.safe_load(ada.request.get(f"/experiments/{experiment.pk}/manifest.yaml").text()) == doc
    assert mf.verify(doc)
    runs = list(experiment.runs.select_related("cell"))
    b0_run = next(r for r in runs if r.cell.cell_id == "B0")
    assert doc["baseline"]["effective_args"]["source"] == mf.CONFIRMED
    deployable, local = mf.split_test_run_local(b0_run.effective_args)
    assert doc["baseline"]["effective_args"]["args"] == deployable
    # The test server's port and served name are kept apart, labelled, not in the config to deploy.
    assert doc["baseline"]["effective_args"]["test_run_only"] == local and "port" not in json.dumps(
        deployable
    )
    assert doc["evidence"]["trace_sha256"] == sorted({r.trace_sha256 for r in runs})
    assert doc["evidence"]["decision"]["outcome"] == decision.outcome
    assert doc["baseline"]["model"]["revision"] == revision
    shot(ada, "j4-approved")
