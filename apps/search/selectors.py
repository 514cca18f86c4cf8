"""Reads of a search experiment's trials, shaped for its page, its report and the API (#36 items 4-5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import QuerySet

from apps.experiments.spec import RUN_OVERHEAD_S
from apps.experiments.spec_search import grid_points
from apps.search.models import SearchTrial
from apps.search.objective import BROKE, KEPT, Trial, pareto_front


def trials_of(experiment_id: int) -> QuerySet[SearchTrial]:
    return SearchTrial.objects.filter(experiment_id=experiment_id).select_related("run").order_by("number")


def search_summary(
    *, experiment_id: int, spec: Mapping[str, Any], run_engine_s: float
) -> dict[str, Any] | None:
    """The search as its page and report show it: every trial (linked to its run), the Pareto
    front of margin against throughput, which knobs mattered, and engine-hours spent against the
    budget and against the grid of the same space (``run_engine_s``: one run's engine time, its
    start included). None for a grid experiment."""
    search = spec.get("search")
    if not search:
        return None
    rows = list(trials_of(experiment_id))
    trials = [r.as_trial() for r in rows]
    finished = [t for t in trials if t.outcome != SearchTrial.Outcome.RUNNING]
    from apps.search.study import importances  # Optuna only when a search is shown

    w = spec.get("workload") or {}
    per_cell = len(w.get("mixtures") or {}) * len(w.get("rates") or {}) * int(w.get("repeats") or 1)
    points = grid_points(search["space"])
    return {
        "trials": [r.as_json() for r in rows],
        "pareto": pareto_front(finished),
        "importances": importances(search["space"], finished),
        "engine_hours": round(sum(t.engine_s for t in trials) / 3600.0, 3),
        "budget_engine_hours": search["budget"].get("max_engine_hours"),
        "max_trials": search["budget"]["max_trials"],
        "grid_configs": points,
        # The grid of the same space, each config through the whole design with B0.
        "grid_engine_hours": round(((points or 0) + 1) * per_cell * run_engine_s / 3600.0, 1),
    }


def run_engine_estimate(*, spec: Mapping[str, Any], trials: Sequence[Trial]) -> float:
    """One run's engine time, its server start included, for the grid's cost: the mean over the
    measured trials (each screened on a server of its own), or before any, the spec's windows and
    drain deadline plus the planning overhead of a start (spec_rules.RUN_OVERHEAD_S)."""
    measured = [t.engine_s for t in trials if t.outcome in (KEPT, BROKE) and t.engine_s > 0]
    if measured:
        return sum(measured) / len(measured)
    w = spec.get("workload") or {}
    windows = sum(float(w.get(k) or 0.0) for k in ("warmup_s", "observation_s", "drain_deadline_s"))
    return windows + RUN_OVERHEAD_S


def search_report(*, experiment_id: int, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """``search_summary`` with the grid's cost from :func:`run_engine_estimate`: what the
    experiment page shows and what ``experiment_report`` (and the API's report) carries as
    ``search``. None for a grid experiment."""
    if not spec.get("search"):
        return None
    trials = [r.as_trial() for r in trials_of(experiment_id)]
    summary = search_summary(
        experiment_id=experiment_id, spec=spec, run_engine_s=run_engine_estimate(spec=spec, trials=trials)
    )
    if summary is not None:
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
        summary["outcomes"] = counts
        summary["confirmed"] = [t["number"] for t in summary["trials"] if t["confirmed"]]
    return summary
