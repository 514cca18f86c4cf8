"""A sweep run executed by the real pipeline on the fake vLLM (tests/engine/fake_server.py, which
starts in milliseconds), for tests of what the worker writes after a replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from apps.experiments.models import Experiment
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.runs.dispatch import ANALYSE_EXPERIMENT, HOST_PULL
from apps.runs.hosts import host_register_local
from apps.runs.models import Run
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import UserFactory, small_spec

FAKE = Path(__file__).resolve().parents[1] / "engine" / "fake_server.py"


def fake_vllm_command(tmp_path: Path, **env: str) -> list[str]:
    """argv of the fake server run with this interpreter's import path (it exports its spans with
    opentelemetry-proto; the launcher passes a server no PYTHONPATH) and ``env`` set."""
    script = tmp_path / "fake_vllm.py"
    script.write_text(
        "import os, runpy, sys\n"
        f"sys.path[:0] = {[p for p in sys.path if p]!r}\n"
        f"os.environ.update({env!r})\n"
        f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n"
    )
    return [sys.executable, str(script)]


def fake_sweep_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, reuse: bool = False, **env: str
) -> Run:
    """The first sweep run of a small experiment (about 8 requests in 2 s) whose host serves the
    fake vLLM with ``env`` (FAKE_SERVER_MODE, FAKE_SERVER_SPAN_SKIP); the pull and the analysis
    are held, so the test executes the run itself (workers.pipeline.run_execute). ``reuse``: the
    spec's engine.reuse."""
    hold_tasks(monkeypatch, HOST_PULL, ANALYSE_EXPERIMENT)
    monkeypatch.setenv("TAILTUNE_VLLM_COMMAND", json.dumps(fake_vllm_command(tmp_path, **env)))
    spec = small_spec()
    spec["engine"] = {"reuse": reuse, "early_stop": False}
    spec["workload"] = {**spec["workload"], "rates": {"low": 4.0}, "warmup_s": 0.5, "observation_s": 1.5}
    spec["workload"]["drain_deadline_s"] = 5
    host_register_local()
    experiment = experiment_create(spec=spec, owner=UserFactory(roles=["experimenter"]))
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    run = experiment.runs.filter(kind=Run.Kind.SWEEP).order_by("plan_position").first()
    assert run is not None
    return run
