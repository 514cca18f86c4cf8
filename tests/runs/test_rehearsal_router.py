"""A rehearsal through the operator's router, on fake servers (starts in milliseconds).

The router is the tests' own (tests/support_router.py); the host's environment names it and
its switch commands (TAILTUNE_ROUTERS, TAILTUNE_SWITCH_COMMANDS), the spec only picks the names.
The pipeline runs the named switch command at the switch and reads the backend from the
router's header; a switch command that exits non-zero fails the rehearsal with its stderr,
and both servers are stopped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.experiments.models import Experiment
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.rehearsal_schedule import rehearsal_start
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.runs.dispatch import ANALYSE_EXPERIMENT, HOST_PULL
from apps.runs.hosts import host_register_local
from apps.runs.models import Host, RequestRecord, Run
from apps.runs.summary_types import RehearsalFacts, RunSummary
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import UserFactory, small_spec
from tests.support_router import running_router
from tests.test_typed_contracts import _problems
from workers.engine.launcher import free_port
from workers.engine.procs import alive_pids
from workers.pipeline import run_execute

FAKE = Path(__file__).resolve().parents[1] / "engine" / "fake_server.py"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def router() -> Iterator[dict[str, Any]]:
    ports = {"candidate": free_port(), "b0": free_port()}
    backends = {who: f"http://127.0.0.1:{port}" for who, port in ports.items()}
    with running_router(backends) as url:
        yield {"url": url, "ports": ports}


def _rehearse(
    monkeypatch: pytest.MonkeyPatch, router: dict[str, Any], to: str, *, withdrawn: bool = False
) -> Run:
    # No task reaches the shared broker: this test runs the pipeline itself and analyses nothing.
    hold_tasks(monkeypatch, HOST_PULL, ANALYSE_EXPERIMENT)
    monkeypatch.setenv("TAILTUNE_VLLM_COMMAND", json.dumps([sys.executable, str(FAKE)]))
    spec = small_spec()
    spec["workload"] = {
        **spec["workload"],
        "rates": {"near": 4.0},
        "warmup_s": 1,
        "observation_s": 4,
        "drain_deadline_s": 3,
    }
    # What the operator lets this host run and reach; the spec below names them only.
    monkeypatch.setenv(
        "TAILTUNE_SWITCH_COMMANDS",
        json.dumps({"flip": [sys.executable, "-m", "tests.support_router", "switch", router["url"], to]}),
    )
    monkeypatch.setenv(
        "TAILTUNE_ROUTERS",
        json.dumps({"test-router": {"url": router["url"], "backend_header": "X-Served-By"}}),
    )
    host_register_local()
    spec["recovery"] = {
        "standby": "warm",
        "switch_at_s": 2.5,
        "switch": "flip",
        "router": "test-router",
        "ports": router["ports"],
    }
    owner = UserFactory(roles=["experimenter"])
    experiment = experiment_create(spec=spec, owner=owner)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    experiment.runs.filter(kind=Run.Kind.SWEEP).update(status=Run.Status.DONE)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.ANALYSED)
    run = rehearsal_start(experiment=experiment, cell_id="C1", actor=owner)
    if withdrawn:  # the operator took the switch off this host after the experiment was created
        monkeypatch.delenv("TAILTUNE_SWITCH_COMMANDS")
    run_execute(run_pk=run.pk)
    run.refresh_from_db()
    return run


def test_the_switch_command_runs_at_the_switch_and_the_backend_header_is_recorded(monkeypatch, router):
    run = _rehearse(monkeypatch, router, "b0")
    assert run.status == "done", run.reason
    facts = run.summary["rehearsal"]
    assert _problems({**run.summary, "rehearsal": None}, RunSummary, "summary") == []
    assert _problems(facts, RehearsalFacts, "summary.rehearsal") == []  # the worker's and the client's
    assert facts["mode"] == "router" and facts["switch_command_exit"] == 0
    assert facts["switch"] == "flip" and facts["router"] == "test-router"
    assert router["url"] not in json.dumps(run.summary)  # the names are kept, not the address
    assert 2.5 <= facts["switch_command_started_at_s"] < 3.5
    records = list(RequestRecord.objects.filter(run=run).order_by("planned_ns"))
    assert len(records) == run.requests_planned
    backends = [r.backend for r in records]
    assert set(backends) == {"candidate", "b0"}
    # Before the command ran, the router sent everything to the candidate; after it finished, to B0.
    for r in records:
        if r.sent_ns < facts["switch_command_started_at_s"] * 1e9:
            assert r.backend == "candidate", r.index
        if r.sent_ns > facts["switch_command_ended_at_s"] * 1e9:
            assert r.backend == "b0", r.index
    assert not alive_pids(run.summary["servers"]["candidate"] + run.summary["servers"]["b0"])


def test_a_switch_command_that_fails_fails_the_rehearsal_with_its_stderr_and_stops_both_servers(
    monkeypatch, router
):
    run = _rehearse(monkeypatch, router, "nowhere")
    assert run.status == "failed"
    assert "switch command exited with status 1" in run.reason
    assert "unknown backend 'nowhere'" in run.reason  # the command's own stderr
    assert not alive_pids(run.summary["servers"]["candidate"] + run.summary["servers"]["b0"])
    assert Host.objects.get(name=run.host.name).server_pids == []


def test_a_switch_the_host_no_longer_offers_fails_the_rehearsal_before_any_server_starts(monkeypatch, router):
    run = _rehearse(monkeypatch, router, "b0", withdrawn=True)
    assert run.status == "failed"
    assert "offers no switch 'flip'" in run.reason and "TAILTUNE_SWITCH_COMMANDS" in run.reason
    assert not RequestRecord.objects.filter(run=run).exists() and run.server_pid is None


@pytest.mark.django_db
def test_a_stale_analysis_message_never_analyses_an_experiment_early(experiment) -> None:  # type: ignore[no-untyped-def]
    from workers.tasks import analyse_experiment

    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    assert analyse_experiment(experiment_pk=experiment.pk) == "skipped (runs still to finish)"
    experiment.refresh_from_db()
    assert experiment.status == "running" and not hasattr(experiment, "decision")
    assert analyse_experiment(experiment_pk=10**9) == "skipped (no such experiment)"
