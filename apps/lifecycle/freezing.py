"""Freezing a plan: every trace its queued runs replay generated and stored once by hash
(:func:`plan_traces_freeze`), then each run pointed at its own (:func:`plan_traces_attach`).

The start of an experiment does both (apps/lifecycle/running.experiment_freeze_and_enqueue), and
so does a search's confirmation for the runs it plans (apps/lifecycle/search_steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apps.experiments.models import Experiment, Workload
from apps.runs.models import Run

if TYPE_CHECKING:
    from apps.workloads.models import Trace


@dataclass(frozen=True)
class FrozenPlan:
    """The stored traces an experiment's queued runs replay, by what each kind looks them up by."""

    sweep: dict[tuple[str, str, int], Trace]  # (mixture, rate, repeat) -> trace
    uniform: dict[tuple[str, str, int], Trace]  # the same keys, repeat 1, constant spacing
    scenarios: dict[str, Trace]  # failure scenario -> trace
    probe: Trace | None  # the quality probe, when the spec has one


def plan_traces_freeze(*, experiment: Experiment) -> FrozenPlan:
    """Generate and store (once by hash) every trace the experiment's planned runs replay: the
    sweep's (mixture, rate, repeat) traces when it has sweep runs, their uniform companions',
    the failure scenarios' and the quality probe. Slow (minutes for a large plan): a task on a
    host's worker runs it, at the start (:func:`experiment_freeze_and_enqueue`) and for a
    search's confirmation (apps/lifecycle/search_steps.py). Raises what generation raises."""
    from apps.lifecycle.scenario_schedule import scenario_traces_freeze
    from apps.workloads.corpus_store import experiment_corpus_prompts
    from apps.workloads.services import quality_probe_freeze, workload_traces_freeze

    corpus = experiment_corpus_prompts(experiment)  # the spec's workload.prompts, if any
    planned = set(experiment.runs.values_list("kind", flat=True).distinct())
    return FrozenPlan(
        sweep=workload_traces_freeze(experiment=experiment, corpus=corpus)
        if Run.Kind.SWEEP in planned
        else {},
        uniform=workload_traces_freeze(experiment=experiment, uniform=True, repeats=[1], corpus=corpus)
        if Run.Kind.UNIFORM in planned
        else {},
        scenarios=scenario_traces_freeze(experiment=experiment),
        probe=quality_probe_freeze(experiment=experiment),
    )


def plan_traces_attach(*, experiment: Experiment, frozen: FrozenPlan) -> list[Run]:
    """Point the experiment's queued runs (not the probes, run inline) at their frozen traces and
    save them; returns them in plan order, ready to dispatch. A run that already replays a
    stored trace (a search's screening run) keeps it. Call inside the caller's transaction."""
    from apps.lifecycle.scenario_schedule import scenario_runs_attach

    runs = list(
        experiment.runs.filter(status=Run.Status.QUEUED)
        .exclude(kind__in=sorted(Run.PROBES))
        .order_by("plan_position")
    )
    for run in runs:
        if run.kind not in (Run.Kind.SWEEP, Run.Kind.UNIFORM):
            continue
        trace = (frozen.uniform if run.kind == Run.Kind.UNIFORM else frozen.sweep)[
            (run.mixture, run.rate_name, run.repeat)
        ]
        run.trace = trace
        run.trace_sha256 = trace.sha256
        run.corpus_sha256 = trace.corpus_sha256
        run.requests_planned = trace.requests
    scenario_runs_attach(runs=[r for r in runs if r.kind == Run.Kind.SCENARIO], traces=frozen.scenarios)
    Run.objects.bulk_update(runs, ["trace", "trace_sha256", "corpus_sha256", "requests_planned", "rate_rps"])
    if frozen.probe is not None:
        Workload.objects.filter(experiment_id=experiment.pk).update(quality_probe_sha256=frozen.probe.sha256)
    return runs
