"""Engine-time accounting: what an experiment planned and spent on its servers, and where.

Each run records what its server cost it in ``summary["engine_time"]`` (workers/pipeline.py):
``start_s`` (start and confirmation; absent on a reused server), ``warmup_s`` (the warm-up
requests and the quality probe), ``idle_check_s`` (waiting for a reused server to go idle),
``windows_s`` (the trace's warm-up and observation windows), ``drain_s`` (from the end of
the windows until the last request finished, at most the drain deadline) and ``stop_s``.
:func:`engine_time_account` (pure) turns those into:

1. spent engine-seconds in all, split by those parts;
2. planned engine-seconds: every planned run on a server of its own and a drain that waits
   its whole deadline, with the measured mean start (start + warm-up + stop of the servers
   that did start) standing in for a start;
3. what reuse saved (runs that found their server up: a start each, less their idle
   checks), what early stopping saved (skipped runs: their windows and a mean drain, and a
   start for every server no run of a skipped group needed), and what ending the drain as
   soon as every request finished saved against waiting the whole deadline;
4. per host: busy (engine-seconds of its runs) and idle (the experiment's span less busy).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from apps.experiments.models import Experiment
from apps.runs.models import Run

PARTS = ("start_s", "warmup_s", "idle_check_s", "windows_s", "drain_s", "stop_s")
START_PARTS = ("start_s", "warmup_s", "stop_s")


def _r(x: float) -> float:
    return round(float(x), 1)


def engine_time_account(
    runs: Iterable[Mapping[str, Any]], *, default_start_s: float
) -> dict[str, Any] | None:
    """Steps 1-4 (module docstring) over run rows: ``status``, ``host``, ``cell``, ``repeat``,
    ``kind``, ``planned_s`` (warm-up + observation + drain deadline), ``windows_s``
    (warm-up + observation), ``drain_deadline_s``, ``engine_time`` (the recorded parts or
    None), ``started_at`` and ``finished_at``. None when no run has recorded any."""
    rows = list(runs)
    measured = [r for r in rows if r.get("engine_time")]
    if not measured:
        return None
    spent = {p: 0.0 for p in PARTS}
    for r in measured:
        for p in PARTS:
            spent[p] += float(r["engine_time"].get(p) or 0.0)
    starts = [r for r in measured if r["engine_time"].get("start_s") is not None]
    mean_start = (
        sum(sum(float(r["engine_time"].get(p) or 0.0) for p in START_PARTS) for r in starts) / len(starts)
        if starts
        else default_start_s
    )
    drains = [float(r["engine_time"].get("drain_s") or 0.0) for r in measured]
    mean_drain = sum(drains) / len(drains)
    planned = sum(float(r["planned_s"]) + mean_start for r in rows if r["status"] != Run.Status.CANCELLED)
    reused = [r for r in measured if r["engine_time"].get("start_s") is None]
    saved_reuse = sum(mean_start - float(r["engine_time"].get("idle_check_s") or 0.0) for r in reused)
    skipped = [r for r in rows if r["status"] == Run.Status.SKIPPED]
    groups: dict[tuple[Any, Any], list[str]] = defaultdict(list)
    for r in rows:
        if r["kind"] == Run.Kind.SWEEP:
            groups[(r["cell"], r["repeat"])].append(r["status"])
    never_started = sum(
        1 for statuses in groups.values() if statuses and set(statuses) == {Run.Status.SKIPPED}
    )
    saved_early = sum(float(r["windows_s"]) + mean_drain for r in skipped) + never_started * mean_start
    saved_drain = sum(
        max(0.0, float(r["drain_deadline_s"]) - float(r["engine_time"].get("drain_s") or 0.0))
        for r in measured
    )
    total = sum(spent.values())
    times = [(r["started_at"], r["finished_at"]) for r in measured if r["started_at"] and r["finished_at"]]
    span = (max(t[1] for t in times) - min(t[0] for t in times)).total_seconds() if times else 0.0
    hosts: dict[str, float] = defaultdict(float)
    for r in measured:
        hosts[r["host"] or "?"] += sum(float(r["engine_time"].get(p) or 0.0) for p in PARTS)
    return {
        "spent_s": _r(total),
        "spent_parts_s": {p.removesuffix("_s"): _r(v) for p, v in spent.items()},
        "planned_s": _r(planned),
        "ratio_planned_to_spent": round(planned / total, 2) if total else None,
        "server_starts": len(starts),
        "runs_measured": len(measured),
        "runs_reused": len(reused),
        "runs_skipped": len(skipped),
        "mean_start_s": _r(mean_start),
        "mean_drain_s": _r(mean_drain),
        "saved_s": {"reuse": _r(saved_reuse), "early_stop": _r(saved_early), "drain": _r(saved_drain)},
        "span_s": _r(span),
        "hosts": [
            {"host": name, "busy_s": _r(busy), "idle_s": _r(max(0.0, span - busy))}
            for name, busy in sorted(hosts.items())
        ],
    }


def engine_time_summary(*, experiment: Experiment) -> dict[str, Any] | None:
    """:func:`engine_time_account` of the experiment's runs (the capacity probe's included)."""
    from apps.experiments.spec import RUN_OVERHEAD_S

    rows = []
    for r in experiment.runs.values(
        "status", "host__name", "cell__cell_id", "repeat", "kind", "warmup_seconds",
        "observation_seconds", "drain_deadline_seconds", "summary__engine_time", "started_at", "finished_at",
    ):  # fmt: skip
        windows = float(r["warmup_seconds"]) + float(r["observation_seconds"])
        rows.append(
            {
                "status": r["status"],
                "host": r["host__name"],
                "cell": r["cell__cell_id"],
                "repeat": r["repeat"],
                "kind": r["kind"],
                "windows_s": windows,
                "drain_deadline_s": float(r["drain_deadline_seconds"]),
                "planned_s": windows + float(r["drain_deadline_seconds"]),
                "engine_time": r["summary__engine_time"]
                if isinstance(r["summary__engine_time"], dict)
                else None,
                "started_at": _dt(r["started_at"]),
                "finished_at": _dt(r["finished_at"]),
            }
        )
    return engine_time_account(rows, default_start_s=RUN_OVERHEAD_S)


def _dt(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None
