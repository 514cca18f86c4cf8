"""A search's screening runs scored onto their trials (#36 item 3, the first step of the wiring).

When a screening run ends, its ``SearchTrial`` (the row the optimiser rebuilds its study from,
apps/search/study.py) is recorded: a done run with its worst class's margin to the contract at
the screening point (apps/search/objective.worst_margin, on the p99s the report's path reads,
apps/analysis/screening.py) and its throughput; any other end (the server did not start, the run
failed, was invalid or cancelled) as failed with the run's reason, so the search goes on and the
optimiser avoids that region. Either way the engine time the run's server cost counts against the
budget.

The run pipeline calls this after each screening run, through
apps/lifecycle/search_steps.search_after_run, which then takes the search's next step.
"""

from __future__ import annotations

from django.db import transaction

from apps.analysis.family import primary_metrics
from apps.analysis.services import screening_measures
from apps.runs.models import Run
from apps.search.models import SearchTrial
from apps.search.objective import worst_margin


def run_engine_s(run: Run) -> float:
    """What the run's server cost it (the parts its summary records), else its windows' length."""
    parts = (run.summary or {}).get("engine_time") if isinstance(run.summary, dict) else None
    if isinstance(parts, dict) and parts:
        return float(sum(float(v) for v in parts.values() if isinstance(v, (int, float))))
    if run.started_at and run.finished_at:
        return max(0.0, (run.finished_at - run.started_at).total_seconds())
    return 0.0


@transaction.atomic
def search_trial_finished(*, run_id: int) -> str:
    """Record the trial of a finished screening run; returns what happened, in words.

    Idempotent: a trial already recorded, or a run that is no trial's or not finished, is left
    as it is (a redelivered message changes nothing)."""
    trial = SearchTrial.objects.select_for_update().filter(run_id=run_id).first()
    if trial is None:
        return "skipped (not a screening run)"
    if trial.outcome != SearchTrial.Outcome.RUNNING:
        return f"skipped (trial {trial.number} is {trial.outcome} already)"
    run = Run.objects.select_related("experiment__workload").get(pk=run_id)
    if run.status not in Run.FINISHED:
        return f"skipped (its run is {run.status})"
    engine_s = run_engine_s(run)
    if run.status != Run.Status.DONE:
        why = run.reason or f"its screening run ended {run.status}"
        trial.mark_failed(reason=f"{run.status}: {why}" if run.reason else why, engine_s=engine_s)
        return f"trial {trial.number} failed: {trial.reason}"
    measures = screening_measures(experiment=run.experiment, run=run)
    classes = measures["classes"]
    contracts = {
        str(c["name"]): {
            k: float(c[k]) for k in ("ttft_p99_ms", "e2e_p99_ms", "max_stall_ms") if c.get(k) is not None
        }
        for c in classes
    }
    margin, worst = worst_margin(measures["p99s"], contracts, primary_metrics(classes))
    trial.mark_measured(
        margin=margin, worst_class=worst, throughput_rps=measures["throughput_rps"], engine_s=engine_s
    )
    return f"trial {trial.number} {trial.outcome}: margin {margin:.3f} ({worst})"
