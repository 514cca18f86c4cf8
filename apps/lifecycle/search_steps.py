"""A search experiment's life after its start: screening trials one at a time, then confirming
the best k on fresh data (issue #36, docs/SEARCH.md).

The start (apps/lifecycle/running.experiment_freeze_and_enqueue) freezes the screening point's
trace, a draw of its own (repeat ``repeats + 1``: no confirmation round replays it), and asks
:func:`search_advance` for the first trials. After each screening run the run pipeline calls
:func:`search_after_run`: the run is scored onto its trial (apps/lifecycle/search.py), then
apps/search/steps.next_step decides from the spec and the recorded trials alone:

- SCREEN: a trial's cell (role ``trial``: no candidate, left out of the report), its
  ``SearchTrial`` (running) and one SCREEN run replaying the screening trace, dispatched like
  any run;
- WAIT: nothing (another host's trial is still running);
- CONFIRM: the best k trials are marked confirmed, their cells become candidates, and B0 and
  they are planned through the whole design (apps/lifecycle/planning.plan_runs_build) in rounds
  of a seed of their own (:func:`confirmation_seed`), their traces frozen and attached as at the
  start (apps/lifecycle/freezing.py), and dispatched. The analysis follows those
  runs: apps/lifecycle/completion.experiment_check_finished never analyses a search that has
  not confirmed.

Each step runs under the experiment's row lock, so a redelivered hook or two hosts finishing
trials at once make one step, not two; the confirmation is marked by the sweep runs it plans.
A step that raises leaves the experiment planned with the error as its reason (audited as
``experiment.search_failed``); the runs and trials so far stay, and starting it again resumes
from the recorded trials.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.db import transaction
from django.db.models import Max

from apps.audit.services import audit_record
from apps.experiments.models import Experiment, ServerConfig
from apps.lifecycle.freezing import plan_traces_attach, plan_traces_freeze
from apps.lifecycle.planning import plan_runs_build
from apps.lifecycle.runs import run_build
from apps.lifecycle.search import search_trial_finished
from apps.lifecycle.transition import experiment_transition
from apps.runs.models import Run
from apps.runs.scheduling import hosts_qualifying, runs_dispatch
from apps.search.models import SearchTrial
from apps.search.steps import CONFIRM, SCREEN, Step, next_step
from apps.workloads.models import Trace

log = logging.getLogger(__name__)


def confirmation_seed(seed: int) -> int:
    """The confirmation rounds' plan seed: derived from the workload's, and not it, so the
    confirmation's order is a fresh randomisation, the same on every machine."""
    digest = hashlib.sha256(f"tailtune-confirm:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def screening_repeat(experiment: Experiment) -> int:
    """The repeat number of the screening point's trace: past every confirmation round's."""
    return int(experiment.workload.repeats) + 1


def screening_trace_freeze(*, experiment: Experiment) -> Trace:
    """Generate and store (once by hash) the trace of the search's screening point: its mixture
    and rate, drawn as repeat ``repeats + 1``, so the confirmation rounds run on fresh data."""
    from apps.workloads.corpus_store import experiment_corpus_prompts
    from apps.workloads.services import workload_traces_freeze

    point = (
        experiment.spec["search"]["screening"]["mixture"],
        experiment.spec["search"]["screening"]["rate"],
    )
    repeat = screening_repeat(experiment)
    traces = workload_traces_freeze(
        experiment=experiment,
        corpus=experiment_corpus_prompts(experiment),
        repeats=[repeat],
        points=[point],
    )
    return traces[(*point, repeat)]


def search_after_run(*, run_id: int) -> str:
    """The pipeline's hook after a screening run: score it onto its trial, then take the next
    step; returns what happened, in words. Never raises: a trial that cannot be scored is
    recorded failed with why (the run and its records stay), and a step that fails leaves the
    experiment planned with the error (:func:`search_advance`)."""
    run = Run.objects.filter(pk=run_id).only("pk", "experiment_id", "kind").first()
    if run is None or run.kind != Run.Kind.SCREEN:
        return "skipped (not a screening run)"
    try:
        scored = search_trial_finished(run_id=run_id)
    except Exception as exc:
        log.exception("scoring screening run %s failed", run_id)
        scored = _trial_unscored(run_id=run_id, error=f"{type(exc).__name__}: {exc}")
    return f"{scored}; {search_advance(experiment_id=run.experiment_id)}"


def search_run_requeued(*, run_id: int, retry_id: int | None) -> str:
    """A screening run lost with its worker or host (apps/lifecycle/retries.run_requeue_once):
    its trial moves to the fresh attempt, so that attempt's end scores it; with no attempt left,
    the trial is scored failed with the run's reason and the search goes on."""
    if retry_id is not None:
        moved = SearchTrial.objects.filter(run_id=run_id, outcome=SearchTrial.Outcome.RUNNING).update(
            run_id=retry_id
        )
        return f"trial moved to run {retry_id}" if moved else "skipped (no running trial)"
    return search_after_run(run_id=run_id)


def _trial_unscored(*, run_id: int, error: str) -> str:
    """A finished screening run whose scoring raised: its trial failed with the error (a trial
    left running would hold the search waiting on it for ever)."""
    from apps.lifecycle.search import run_engine_s

    with transaction.atomic():
        trial = SearchTrial.objects.select_for_update().filter(run_id=run_id).first()
        if trial is None or trial.outcome != SearchTrial.Outcome.RUNNING:
            return "skipped (no running trial)"
        run = Run.objects.get(pk=run_id)
        if run.status not in Run.FINISHED:
            return f"skipped (its run is {run.status})"
        trial.mark_failed(
            reason=f"its screening run could not be scored: {error}", engine_s=run_engine_s(run)
        )
    return f"trial {trial.number} failed: {trial.reason}"


def search_advance(*, experiment_id: int, screening: Trace | None = None) -> str:
    """Take the search's next step now (module docstring); returns what happened, in words.

    ``screening``: the screening point's frozen trace, when the caller has it (the start); else
    a trial replays the trace of the experiment's earlier screening runs. Idempotent: a step is
    taken from the recorded trials under the experiment's lock, and a search that confirmed
    already is left as it is. Never raises: a failure leaves the experiment planned with why."""
    try:
        return _advance(experiment_id=experiment_id, screening=screening)
    except Exception as exc:
        log.exception("the search step of experiment %s failed", experiment_id)
        error = f"{type(exc).__name__}: {exc}"[:2000]
        experiment = Experiment.objects.get(pk=experiment_id)
        moved = experiment_transition(
            experiment,
            Experiment.Status.PLANNED,
            reason=f"the search's next step failed: {error}; start it again to resume from its trials",
            actor=None,
            action="experiment.search_failed",
            detail={"error": error},
            expect={Experiment.Status.RUNNING},
        )
        if not moved:  # cancelled meanwhile: the failure is still on record
            audit_record(action="experiment.search_failed", experiment=experiment, detail={"error": error})
        return f"search step failed: {error}"[:500]


def _advance(*, experiment_id: int, screening: Trace | None) -> str:
    with transaction.atomic():
        experiment = (
            Experiment.objects.select_for_update(of=("self",))
            .select_related("workload")
            .get(pk=experiment_id)
        )
        search = (experiment.spec or {}).get("search")
        if not search:
            return "skipped (not a search)"
        if experiment.status != Experiment.Status.RUNNING:
            return f"skipped (experiment is {experiment.status})"
        if search_confirmed(experiment):
            return "skipped (confirmation planned already)"
        rows = list(SearchTrial.objects.filter(experiment=experiment).order_by("number"))
        baseline = experiment.cells.get(role=ServerConfig.Role.BASELINE)
        pending = [dict(r.params) for r in rows if r.outcome == SearchTrial.Outcome.RUNNING]
        finished = [r.as_trial() for r in rows if r.outcome != SearchTrial.Outcome.RUNNING]
        concurrency = max(1, len(hosts_qualifying(experiment)))

        def ask() -> Step:
            return next_step(
                search,
                finished,
                pending=pending,
                baseline_args=baseline.args,
                max_model_len=experiment.max_model_len,
                seed=int(experiment.workload.seed),
                concurrency=concurrency,
            )

        step = ask()
        screened: list[Run] = []
        while step.action == SCREEN:
            source = _screening_source(experiment, screening)
            screened.append(_trial_create(experiment, step, number=len(rows) + len(screened), source=source))
            pending.append(step.params)
            step = ask()
        if screened:
            runs_dispatch(screened, experiment)
            return f"screening {', '.join(r.cell.cell_id for r in screened)}"
        if step.action != CONFIRM:
            return "waiting for the trials still running"
        if not step.cells:
            experiment_transition(
                experiment,
                Experiment.Status.CANCELLED,
                reason=f"the search measured no config to confirm ({step.why}): every trial failed; "
                "see the trials' reasons",
                actor=None,
                action="experiment.search_failed",
                detail={"error": "no trial measured", "why": step.why},
            )
            return "no trial measured: nothing to confirm"
        runs = _confirm(experiment, step, baseline=baseline, trials=rows)
        # Every run the confirmation planned, its traces frozen and attached as at the start; the
        # row stays locked meanwhile (no other run of the experiment is going: every trial ended).
        queued = plan_traces_attach(experiment=experiment, frozen=plan_traces_freeze(experiment=experiment))
        runs_dispatch(queued, experiment)
        return f"confirming {', '.join(c['id'] for c in step.cells)} in {len(runs)} runs ({step.why})"


def search_confirmed(experiment: Experiment) -> bool:
    """Whether the search has planned its confirmation (its sweep runs: B0's at least)."""
    return experiment.runs.filter(kind=Run.Kind.SWEEP).exists()


def _screening_source(experiment: Experiment, screening: Trace | None) -> Trace | Run:
    """What a new screening run replays: the frozen screening trace the caller holds, else an
    earlier screening run's (the same trace); else the trace is frozen now."""
    if screening is not None:
        return screening
    earlier = (
        experiment.runs.filter(kind=Run.Kind.SCREEN, trace__isnull=False).order_by("plan_position").first()
    )
    return earlier if earlier is not None else screening_trace_freeze(experiment=experiment)


def _trial_create(experiment: Experiment, step: Step, *, number: int, source: Trace | Run) -> Run:
    """Trial ``number``'s cell, its SearchTrial (running) and its queued screening run, saved."""
    experiment.assert_accepts_runs(kind=Run.Kind.SCREEN)
    point = experiment.spec["search"]["screening"]
    cell = ServerConfig.with_trials.create(
        experiment=experiment,
        cell_id=f"T{number}",
        role=ServerConfig.Role.TRIAL,
        args=step.args,
        position=number + 1,
    )
    where: dict[str, Any] = {"replays": source} if isinstance(source, Run) else {"trace": source}
    run = run_build(
        experiment=experiment,
        kind=Run.Kind.SCREEN,
        cell=cell,
        mixture=point["mixture"],
        rate_name=point["rate"],
        rate_rps=experiment.workload.rate_for(point["mixture"], point["rate"]),
        repeat=screening_repeat(experiment),
        round_position=0,
        plan_position=number,
        **where,
    )
    run.save()
    SearchTrial.objects.create(
        experiment=experiment, number=number, params=step.params, args=step.args, run=run
    )
    return run


def _confirm(
    experiment: Experiment, step: Step, *, baseline: ServerConfig, trials: list[SearchTrial]
) -> list[Run]:
    """Mark the step's trials confirmed, make their cells candidates, and plan B0 and them through
    the whole design after the screening runs; returns the saved runs."""
    experiment.assert_accepts_runs(kind=Run.Kind.SWEEP)
    numbers = [int(c["trial"]) for c in step.cells]
    SearchTrial.objects.filter(experiment=experiment, number__in=numbers).update(confirmed=True)
    by_id = {c.cell_id: c for c in ServerConfig.with_trials.filter(experiment=experiment)}
    cells = [baseline]
    for entry in step.cells:
        cell = by_id[entry["id"]]
        cell.role = ServerConfig.Role.CANDIDATE
        cell.args = entry["args"]
        cell.save(update_fields=["role", "args"])
        cells.append(cell)
    last = experiment.runs.exclude(kind__in=sorted(Run.PROBES)).aggregate(m=Max("plan_position"))["m"]
    runs = Run.objects.bulk_create(
        plan_runs_build(
            experiment=experiment,
            cells=cells,
            seed=confirmation_seed(int(experiment.workload.seed)),
            first_position=0 if last is None else last + 1,
        )
    )
    audit_record(
        action="experiment.search_confirmed",
        experiment=experiment,
        detail={
            "cells": [c["id"] for c in step.cells],
            "trials": numbers,
            "why": step.why,
            "runs": len(runs),
            "screened": len(trials),
        },
    )
    return runs
