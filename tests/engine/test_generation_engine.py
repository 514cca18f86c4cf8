"""controls.generation and the quality probe on the real CPU vLLM: the sampling settings reach the server with every
request, each run records what its requests carried, and a cell whose requests carried other
settings (here: a worker that sends another seed and temperature for C1) is invalid.

Two sweep runs of one small experiment, through the real pipeline (``workers.pipeline.run_execute``)
one after the other, then the report's validity check on what they recorded.
"""

from __future__ import annotations

from typing import Any

import pytest

from apps.analysis.services import experiment_report_build
from apps.experiments.models import Experiment
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.runs.dispatch import ANALYSE_EXPERIMENT, HOST_PULL
from apps.runs.hosts import host_register_local
from apps.runs.models import RequestRecord, Run
from tests.dispatch_support import hold_tasks
from tests.engine_support import ENGINE_MARKS
from tests.experiments.factories import UserFactory, small_spec
from workers import pipeline
from workers.pipeline import run_execute

pytestmark = [*ENGINE_MARKS, pytest.mark.django_db(transaction=True)]

GENERATION = {"temperature": 0.0, "top_p": 0.9, "seed": 5, "ignore_eos": True}
SENT = {"seed": 5, "temperature": 0.0, "top_p": 0.9}
OTHER = {"seed": 6, "temperature": 0.7, "top_p": 0.9}


def test_the_sampling_settings_reach_the_server_and_a_cell_sent_with_others_is_invalid(monkeypatch):
    hold_tasks(monkeypatch, HOST_PULL, ANALYSE_EXPERIMENT)
    spec = small_spec()
    spec["controls"] = {**spec["controls"], "generation": GENERATION}
    # The quality probe on every sweep run after warm-up: 2 prompts per class, 8 greedy tokens.
    spec["quality"] = {"probe": {"prompts_per_class": 2, "max_tokens": 8}}
    spec["workload"] = {**spec["workload"], "warmup_s": 1, "observation_s": 6, "max_dispatch_lag_ms": 30000}
    owner = UserFactory(roles=["experimenter"])
    experiment = experiment_create(spec=spec, owner=owner)
    host_register_local()
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    runs = {r.cell.cell_id: r for r in experiment.runs.filter(kind=Run.Kind.SWEEP).select_related("cell")}
    assert set(runs) == {"B0", "C1"}

    # What the bodies of C1's run carry: a worker configured otherwise (another seed and temperature).
    real = pipeline.request_sampling

    def sampling(generation: dict[str, Any] | None) -> dict[str, Any]:
        return dict(OTHER) if current["cell"] == "C1" else real(generation)

    current = {"cell": ""}
    monkeypatch.setattr(pipeline, "request_sampling", sampling)
    for cell in ("B0", "C1"):
        current["cell"] = cell
        assert run_execute(run_pk=runs[cell].pk) == "done", Run.objects.get(pk=runs[cell].pk).reason

    for cell, sent in (("B0", SENT), ("C1", OTHER)):
        run = Run.objects.get(pk=runs[cell].pk)
        # The run records what its requests carried (the flag belongs to the replay, not the body).
        assert run.generation == sent
        # vLLM served every request with those fields: it answers 400 to a field it does not take.
        records = RequestRecord.objects.filter(run=run)
        assert records.count() == run.requests_planned
        assert not records.exclude(http_status=200).exists()

    for cell in ("B0", "C1"):
        probe = Run.objects.get(pk=runs[cell].pk).summary["quality_probe"]
        assert [o["class"] for o in probe["outputs"]] == ["short", "short", "long", "long"]
        assert all(o["token_ids"] and "error" not in o for o in probe["outputs"]), probe
    report = experiment_report_build(experiment_id=experiment.pk)
    quality = report["checks"]["quality"]
    assert quality["reference_run"] == str(runs["B0"].run_id)
    assert {c: e["answers"] for c, e in quality["cells"]["C1"].items()} == {"short": 2, "long": 2}
    validity = report["checks"]["validity"]
    assert validity["invalid_cells"] == ["C1"] and validity["baseline_valid"]
    differs = [p for p in validity["problems"] if p["problem"] == "generation settings differ"]
    assert differs and {p["cell"] for p in differs} == {"C1"}
    assert differs[0]["value"] == OTHER and differs[0]["expected"] == SENT
