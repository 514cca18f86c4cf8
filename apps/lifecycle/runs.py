"""The one builder of Run rows: sweep, uniform, calibration, pace, scenario, rehearsal and retry runs.

Every run copies the same things from the same places: the model and tokenizer revisions it
measures from its experiment, and its windows (warm-up, observation, drain deadline) from the
experiment's workload unless the caller gives its own (a scenario's, a probe trace's). A run that
replays a trace already frozen for another run (a rehearsal replays a sweep run's, a retry its
failed attempt's) copies that trace, its request count and the windows it was frozen for.
Callers say what the run is (``kind``, and ``scenario`` for a failure scenario) and where it sits
in the plan; :func:`run_build` returns the row unsaved, so a caller decides how to save it (one
``bulk_create`` for a plan, one ``save`` under the experiment's lock for the others).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from apps.runs.models import Run

if TYPE_CHECKING:
    from apps.experiments.models import Experiment, ServerConfig
    from apps.workloads.models import Trace

# Fields a retry never copies from its failed attempt: its identity, how that attempt went,
# and what the host that serves the retry records afresh.
RETRY_FRESH = frozenset(
    {
        "id", "run_id", "status", "reason", "attempts", "host", "server_pid", "log_path", "log_tail",
        "requests_sent", "effective_args", "started_at", "measuring_at", "finished_at", "created_at",
        "updated_at", "summary", "dispatch_lag_p50_ms", "dispatch_lag_p99_ms", "dispatch_lag_max_ms",
        "achieved_rate_rps", "image_digest", "vllm_version", "hardware_id", "retry_of", "generation",
        "live", "dispatched_at",
    }
)  # fmt: skip


def run_build(
    *,
    experiment: Experiment,
    kind: str,
    cell: ServerConfig,
    mixture: str,
    rate_name: str,
    rate_rps: float,
    round_position: int,
    plan_position: int,
    repeat: int = 1,
    scenario: str = "",
    windows: Mapping[str, float] | None = None,
    trace: Trace | None = None,
    replays: Run | None = None,
    retry_of: Run | None = None,
) -> Run:
    """An unsaved queued run of ``experiment``: what it is, where it sits, and everything it copies.

    ``kind`` is one of :class:`Run.Kind`; ``scenario`` names the failure scenario of a
    ``scenario`` run and is empty for every other kind. ``windows`` (``warmup_s``,
    ``observation_s``, ``drain_deadline_s``) replaces the workload's; ``trace`` is a stored
    trace the run replays; ``replays`` is a run whose frozen trace and windows this one
    replays (at most one of ``trace`` and ``replays``, and no ``windows`` with ``replays``).
    Raises ValueError naming the argument that does not fit.
    """
    if kind not in Run.Kind.values:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(Run.Kind.values)}")
    if (kind == Run.Kind.SCENARIO) != bool(scenario):
        raise ValueError(
            f"scenario: a {kind} run needs a failure scenario's name"
            if kind == Run.Kind.SCENARIO
            else f"scenario: only a scenario run names a failure scenario, not a {kind} run ({scenario!r})"
        )
    if replays is not None and (trace is not None or windows is not None):
        raise ValueError("replays: a run replaying another's trace takes its windows and trace from it")
    run = Run(
        experiment=experiment,
        cell=cell,
        kind=kind,
        scenario=scenario,
        mixture=mixture,
        rate_name=rate_name,
        rate_rps=rate_rps,
        repeat=repeat,
        round_position=round_position,
        plan_position=plan_position,
        model_revision=experiment.model_revision,
        tokenizer_revision=experiment.tokenizer_revision,
        retry_of=retry_of,
    )
    if replays is not None:
        run.trace_id = replays.trace_id
        run.trace_sha256 = replays.trace_sha256
        run.corpus_sha256 = replays.corpus_sha256
        run.requests_planned = replays.requests_planned
        run.warmup_seconds = replays.warmup_seconds
        run.observation_seconds = replays.observation_seconds
        run.drain_deadline_seconds = replays.drain_deadline_seconds
        return run
    if trace is not None:
        run.trace = trace
        run.trace_sha256 = trace.sha256
        run.corpus_sha256 = trace.corpus_sha256
        run.requests_planned = trace.requests
    if windows is None:
        w = experiment.workload
        windows = {
            "warmup_s": w.warmup_s,
            "observation_s": w.observation_s,
            "drain_deadline_s": w.drain_deadline_s,
        }
    run.warmup_seconds = float(windows["warmup_s"])
    run.observation_seconds = float(windows["observation_s"])
    run.drain_deadline_seconds = float(windows["drain_deadline_s"])
    return run


def run_retry_build(*, run: Run) -> Run:
    """An unsaved fresh attempt at ``run`` (linked by ``retry_of``): the same point of the plan,
    replaying the same trace; nothing of how the failed attempt went (``RETRY_FRESH``)."""
    return run_build(
        experiment=run.experiment,
        kind=run.kind,
        cell=run.cell,
        mixture=run.mixture,
        rate_name=run.rate_name,
        rate_rps=run.rate_rps,
        round_position=run.round_position,
        plan_position=run.plan_position,
        repeat=run.repeat,
        scenario=run.scenario,
        replays=run,
        retry_of=run,
    )
