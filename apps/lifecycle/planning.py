"""The experiment's plan: cells x mixtures x rates x repeats as queued runs, then its failure
scenarios and uniform companions, each built by the one run builder (apps/lifecycle/runs.py)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.experiments.models import Experiment, ServerConfig
from apps.experiments.plan import expand_plan
from apps.lifecycle.runs import run_build
from apps.lifecycle.scenario_schedule import scenario_runs_build
from apps.lifecycle.transition import experiment_transition
from apps.runs.models import Run
from apps.runs.scheduling import reuse_enabled


@transaction.atomic
def experiment_plan(*, experiment: Experiment, actor: Any = None) -> list[Run]:
    """Expand cells x mixtures x rates x repeats into queued runs (replacing an unstarted plan).

    Refused (RunsRefused) on an experiment that takes no more runs (Experiment.assert_accepts_runs).
    """
    experiment.assert_accepts_runs(kind=Run.Kind.SWEEP)
    if experiment.runs.exclude(status=Run.Status.QUEUED).exists():
        raise ValueError("the plan has runs that started already; create a new experiment to change it")
    experiment.runs.all().delete()
    workload = experiment.workload
    cells = {c.cell_id: c for c in experiment.cells.all()}
    planned = expand_plan(
        cell_ids=list(cells),
        mixtures=list(workload.mixtures),
        rates=list(workload.rates),
        repeats=workload.repeats,
        seed=workload.seed,
        group_by_cell=bool(((experiment.spec or {}).get("engine") or {}).get("reuse", True)),
    )
    runs = Run.objects.bulk_create(
        [
            run_build(
                experiment=experiment,
                kind=Run.Kind.SWEEP,
                cell=cells[p.cell_id],
                mixture=p.mixture,
                rate_name=p.rate_name,
                rate_rps=workload.rate_for(p.mixture, p.rate_name),
                repeat=p.repeat,
                round_position=p.round_position,
                plan_position=p.plan_position,
            )
            for p in planned
        ]
    )
    # Failure scenarios (and the priority check) follow the sweep; they are
    # kept apart from it by Run.kind (apps/lifecycle/scenario_schedule.py).
    runs += Run.objects.bulk_create(scenario_runs_build(experiment=experiment, first_position=len(runs)))
    if ((experiment.spec or {}).get("workload") or {}).get("uniform_companion"):
        runs += Run.objects.bulk_create(
            _uniform_companions(experiment, cells=list(cells.values()), first=len(runs))
        )
    experiment_transition(
        experiment,
        Experiment.Status.PLANNED,
        reason=None,
        actor=actor,
        action="experiment.planned",
        detail={"runs": len(runs)},
    )
    return runs


def _uniform_companions(experiment: Experiment, *, cells: list[ServerConfig], first: int) -> list[Run]:
    """One run per (cell, mixture, rate) replaying repeat 1's requests on constant spacing; with
    engine reuse, a cell's companions follow each other (they replay on one server).

    Same requests and mean rate as the bursty trace, so the two differ only in
    burstiness: the p50 barely moves, the p99 is the story.
    """
    w = experiment.workload
    combos = [(c, m, r) for m in sorted(w.mixtures) for r in sorted(w.rates) for c in cells]
    if reuse_enabled(experiment):  # a cell's companions back to back, on one server
        combos.sort(key=lambda combo: cells.index(combo[0]))
    return [
        run_build(
            experiment=experiment,
            kind=Run.Kind.UNIFORM,
            cell=cell,
            mixture=mixture,
            rate_name=rate,
            rate_rps=w.rate_for(mixture, rate),
            round_position=i,
            plan_position=first + i,
        )
        for i, (cell, mixture, rate) in enumerate(combos)
    ]
