"""Experiments with done runs and stored records, for the analysis service and command tests."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from apps.experiments.models import Experiment
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.models import Run
from tests.analysis.builders import request
from tests.experiments.factories import SMALL_SPEC, make_experiment
from workers.replay.records import RequestRecord

Behaviour = Callable[[str, str, int, str, int], Mapping[str, Any]]


def analysis_spec(repeats: int = 2) -> dict[str, Any]:
    workload = copy.deepcopy(SMALL_SPEC["workload"])
    workload.update(repeats=repeats, warmup_s=1, observation_s=10, drain_deadline_s=5, max_dispatch_lag_ms=5)
    return {"workload": workload}


def record_row(run: Run, rec: RequestRecord) -> RecordRow:
    fields = rec.to_json()
    fields.pop("run_id")
    return RecordRow(run=run, **fields)


def done_experiment(
    behaviour: Behaviour | None = None,
    *,
    repeats: int = 2,
    per_run: int = 40,
    spacing_s: float = 0.2,
    store: bool = True,
) -> tuple[Experiment, list[RequestRecord]]:
    """Every planned run marked done on one trace per (mixture, rate, repeat), with records.

    behaviour(cell, mixture, repeat, class, index) -> keyword overrides for builders.request.
    """
    experiment = make_experiment(**analysis_spec(repeats))
    records: list[RequestRecord] = []
    for run in experiment.runs.select_related("cell"):
        run.status = Run.Status.DONE
        run.trace_sha256 = f"trace-{run.mixture}-{run.rate_name}-{run.repeat}"
        run.corpus_sha256 = f"corpus-{run.mixture}-{run.rate_name}-{run.repeat}"
        run.hardware_id = "cpu-test"
        run.dispatch_lag_p99_ms = 1.0
        run.save()
        key = str(run.run_id)
        for i in range(per_run):
            cls = "long" if i % 5 == 4 else "short"
            kw = dict(behaviour(run.cell.cell_id, run.mixture, run.repeat, cls, i) if behaviour else {})
            kw.setdefault("tokens", 8)
            kw.setdefault("expected", 8)
            records.append(request(key, i, cls, int(1e9 + i * spacing_s * 1e9), **kw))
        records.append(request(key, per_run, "short", int(0.2e9), warmup=True, tokens=8, expected=8))
    if store:
        runs = {str(r.run_id): r for r in experiment.runs.all()}
        RecordRow.objects.bulk_create([record_row(runs[r.run_id], r) for r in records])
    return experiment, records


def short_slow_everywhere(cell: str, mixture: str, repeat: int, cls: str, index: int) -> dict[str, Any]:
    """Every cell breaks the short class's TTFT contract (2 s) on shared capacity: isolate."""
    return {"ttft_ms": 5000.0} if cls == "short" else {}


def isolate_experiment(class_capacity: Mapping[str, Any] | None = None) -> Experiment:
    """An experiment whose analysis decides isolate (no cell keeps the short contract), with the
    workload's ``rates_derivation.class_capacity`` set to ``class_capacity`` (cell -> class -> search)."""
    experiment, _ = done_experiment(short_slow_everywhere, per_run=500, spacing_s=0.02)
    workload = experiment.workload
    workload.rates_derivation = {"class_capacity": dict(class_capacity or {})}
    workload.save(update_fields=["rates_derivation"])
    return experiment
