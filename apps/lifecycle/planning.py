"""The experiment's plan: cells x mixtures x rates x repeats as queued runs, then its failure
scenarios and uniform companions, each built by the one run builder (apps/lifecycle/runs.py).

A grid plans its cells when it is created (:func:`experiment_plan`); a search plans nothing then,
and its confirmation plans B0 and the confirmed cells through the same builder
(:func:`plan_runs_build`) in rounds of a seed of their own (apps/lifecycle/search_steps.py).
"""

from __future__ import annotations

from collections.abc import Sequence
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

    A search (the spec's ``search``) plans no run here: its screening runs are made one trial at
    a time once it runs, and its confirmation plans the rest (apps/lifecycle/search_steps.py).
    Refused (RunsRefused) on an experiment that takes no more runs (Experiment.assert_accepts_runs).
    """
    experiment.assert_accepts_runs(kind=Run.Kind.SWEEP)
    if experiment.runs.exclude(status=Run.Status.QUEUED).exists():
        raise ValueError("the plan has runs that started already; create a new experiment to change it")
    experiment.runs.all().delete()
    runs: list[Run] = []
    if not (experiment.spec or {}).get("search"):
        runs = Run.objects.bulk_create(
            plan_runs_build(
                experiment=experiment,
                cells=list(experiment.cells.all()),
                seed=experiment.workload.seed,
                first_position=0,
            )
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


def plan_runs_build(
    *, experiment: Experiment, cells: Sequence[ServerConfig], seed: int, first_position: int
) -> list[Run]:
    """The unsaved queued runs of ``cells`` through the whole design: cells x mixtures x rates x
    repeats in rounds randomised from ``seed`` (apps/experiments/plan.py), then their failure
    scenarios (and the priority check) and, when the spec asks, their uniform companions;
    numbered in the plan from ``first_position``. Traces are attached when the plan is frozen."""
    workload = experiment.workload
    by_id = {c.cell_id: c for c in cells}
    planned = expand_plan(
        cell_ids=list(by_id),
        mixtures=list(workload.mixtures),
        rates=list(workload.rates),
        repeats=workload.repeats,
        seed=seed,
        group_by_cell=reuse_enabled(experiment),
    )
    runs = [
        run_build(
            experiment=experiment,
            kind=Run.Kind.SWEEP,
            cell=by_id[p.cell_id],
            mixture=p.mixture,
            rate_name=p.rate_name,
            rate_rps=workload.rate_for(p.mixture, p.rate_name),
            repeat=p.repeat,
            round_position=p.round_position,
            plan_position=first_position + p.plan_position,
        )
        for p in planned
    ]
    # Failure scenarios (and the priority check) follow the sweep; they are
    # kept apart from it by Run.kind (apps/lifecycle/scenario_schedule.py).
    runs += scenario_runs_build(
        experiment=experiment, cells=list(cells), first_position=first_position + len(runs)
    )
    if ((experiment.spec or {}).get("workload") or {}).get("uniform_companion"):
        runs += _uniform_companions(experiment, cells=list(cells), first=first_position + len(runs))
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
