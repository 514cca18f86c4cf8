"""Early stopping: which candidates can no longer be accepted, whatever their remaining runs show. Pure.

Acceptance (checks.acceptance_check) needs every class's contract to hold at every
agreed (mixture, rate), pooled over the repeats: a limit is broken when the share of
requests over it is above the allowed share by an exact one-sided binomial test
(inference.share_breaks). A cell whose done runs already settle a break there can never
be accepted, so its remaining sweep runs only spend engine time (docs/ANALYSIS.md,
"Early stopping").

The bound. At an agreed (mixture, rate), class and contract key, pool the
``over_limit`` counts [k, n] of the cell's settled repeats (below), and let N be the most
requests the unsettled repeats can still add: the sum, over them, of the largest cohort
a run there can have for that class (the caller's ``bounds``: the trace's non-warm-up
requests of the class, every cohort request being one of them). The point is *doomed*
when ``share_breaks(k, n + N)`` says broken. That is sound: whatever the remaining runs
show, they add some k' >= 0 over the limit out of some n' <= N, and the test's p-value
P(X >= k + k'), X ~ Binomial(n + n', allowed), only falls as k' grows and only rises as
n' grows, so it is at most P(X >= k), X ~ Binomial(n + N, allowed), which already broke.
A point whose bound is unknown is never doomed.

Settled repeats. The report pools, per (cell, mixture, rate, repeat), the first done run
in its run order (plan position, then id). A repeat is settled when that run is known:
its runs in that order, passing over those that ended without data (invalid, failed,
cancelled, skipped), reach a known done run before any run that may still finish. Any
other repeat (queued, running, failed and perhaps retried) counts with its bound.

What stopping changes. A doomed cell fails acceptance whether its remaining runs run or
not, so it is never eligible, never among the cells that keep every contract, and (since
the gain family holds only candidates that pass acceptance, apps/analysis/family.py)
never in the family that sizes the bootstrap and Holm's correction: the decision is the
one the full sweep would have reached (tests/analysis/test_early_stop.py checks it over
the decision table and random result sets).

The run named. The first done run, in ``order`` (the order the runs finished), after
which the cell is doomed: the done runs are added one at a time and the first prefix
that dooms some point names its last run, with the first doomed (mixture, rate), class
and key in sorted order (keys as acceptance lists them: ttft, e2e, stall, error_rate).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from apps.analysis import inference, metrics
from apps.analysis.columns import RecordTable
from apps.analysis.validity import lag_over_tolerance

# The contract keys in the order acceptance judges them, and a p99 limit's allowed share.
KEYS = ("ttft", "e2e", "stall", "error_rate")
P99_SHARE = 0.01
# Run statuses that ended without data: such a run never becomes the repeat's done run.
ENDED_WITHOUT_DATA = frozenset({"invalid", "failed", "cancelled", "skipped"})

Point = tuple[str, str, int]  # (mixture, rate, repeat)
OverLimit = Mapping[str, Mapping[str, Sequence[int]]]  # class -> key -> [over, judged]


def reason(run: str, cls: str, key: str) -> str:
    """What a skipped run records: ``cannot be accepted (run <run> broke <class> <key>)``."""
    return f"cannot be accepted (run {run} broke {cls} {key})"


_REASON = re.compile(
    r"cannot be accepted \(run (?P<run>\S+) broke (?P<cls>.+) (?P<key>ttft|e2e|stall|error_rate)\)"
)


def settled_by(why: str) -> tuple[str, str, str] | None:
    """(run, class, key) that a skipped run's ``reason`` names when early stopping skipped it
    (reason()'s inverse); None for any other reason (a gate's stop at an unusable run)."""
    m = _REASON.fullmatch(why or "")
    return (m["run"], m["cls"], m["key"]) if m else None


def allowed_shares(classes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """class -> contract key -> the share of requests allowed over it (as acceptance_check)."""
    return {
        str(c["name"]): {
            "ttft": P99_SHARE,
            "e2e": P99_SHARE,
            "stall": P99_SHARE,
            "error_rate": float(c.get("error_rate", 0.0)),
        }
        for c in classes
    }


def run_over_limits(
    *,
    runs: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    table: RecordTable,
    natural: bool = False,
) -> dict[str, dict[str, dict[str, list[int]]]]:
    """run key -> class -> ``over_limit`` of that run's cohort, as build_report computes it.

    ``runs`` carry key, warmup_s, observation_s and drain_deadline_s; ``table`` holds their
    records. The same path as the report: metrics.derive, metrics.cohort_groups and
    metrics.class_metrics, so the counts pooled here are the ones acceptance pools.
    """
    contracts = {str(c["name"]): metrics.Contract.from_mapping(c) for c in classes}
    windows = {str(r["key"]): metrics.run_window(r) for r in runs}
    d = metrics.derive(table, windows, contracts, natural=natural)
    groups = metrics.cohort_groups(d)
    empty = np.zeros(0, dtype=np.int64)
    out: dict[str, dict[str, dict[str, list[int]]]] = {}
    for key, w in windows.items():
        per_class: dict[str, dict[str, list[int]]] = {}
        for name, contract in contracts.items():
            m = metrics.class_metrics(
                d, groups.get((key, name), empty), contract=contract, observation_s=w.observation_s
            )
            per_class[name] = {k: [int(v[0]), int(v[1])] for k, v in m["over_limit"].items()}
        out[key] = per_class
    return out


def _settled(runs: Sequence[Mapping[str, Any]], known: set[str]) -> Mapping[str, Any] | None:
    """The run the report will pool for this repeat, when it is known already (else None)."""
    for r in runs:
        if str(r["key"]) in known:
            return r
        if r["status"] not in ENDED_WITHOUT_DATA:
            return None  # it may still finish done, and then it is the one pooled
    return None


def _doomed_points(
    by_point: Mapping[Point, Sequence[Mapping[str, Any]]],
    *,
    points: Mapping[tuple[str, str], Sequence[int]],
    allowed: Mapping[str, Mapping[str, float]],
    over: Mapping[str, OverLimit],
    bounds: Mapping[Point, Mapping[str, int]],
    known: set[str],
    alpha: float,
) -> list[dict[str, Any]]:
    """Every (mixture, rate, class, key) the known runs doom, in sorted order."""
    out = []
    for (mix, rate), reps in sorted(points.items()):
        settled = {rep: _settled(by_point.get((mix, rate, rep), ()), known) for rep in reps}
        for name in sorted(allowed):
            k = dict.fromkeys(KEYS, 0)
            n = dict.fromkeys(KEYS, 0)
            extra: int | None = 0
            for rep, run in settled.items():
                # A settled run without counts given counts as unsettled: never as zero requests.
                if run is not None and str(run["key"]) in over:
                    counts = over[str(run["key"])].get(name) or {}
                    for key in KEYS:
                        got = counts.get(key) or (0, 0)
                        k[key] += int(got[0])
                        n[key] += int(got[1])
                    continue
                most = bounds.get((mix, rate, rep), {}).get(name)
                if most is None or extra is None:
                    extra = None
                else:
                    extra += max(0, int(most))
            if extra is None:
                continue  # a repeat that could add any number of requests: nothing is settled
            for key in KEYS:
                broken, p = inference.share_breaks(k[key], n[key] + extra, allowed[name][key], alpha)
                if broken:
                    out.append(
                        {
                            "mixture": mix,
                            "rate": rate,
                            "class": name,
                            "metric": key,
                            "over": [k[key], n[key]],
                            "most_to_come": extra,
                            "p_value": float(round(p, 6)),
                        }
                    )
    return out


def doomed(
    *,
    cells: Sequence[str],
    baseline: str,
    runs: Sequence[Mapping[str, Any]],
    over: Mapping[str, OverLimit],
    agreed: Sequence[Point],
    classes: Sequence[Mapping[str, Any]],
    bounds: Mapping[Point, Mapping[str, int]],
    alpha: float = 0.05,
    order: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """cell -> why it can no longer be accepted, for every candidate whose done runs settle it.

    1. ``runs``: the sweep runs (empty ``scenario``; others are ignored) as the report lists
       them, in its order: key, cell, mixture, rate, repeat, status.
    2. ``over``: run key -> class -> ``over_limit`` for the done runs (run_over_limits).
    3. ``agreed``: the agreed (mixture, rate, repeat) points (report.agreed_combos).
    4. ``bounds``: (mixture, rate, repeat) -> class -> the most cohort requests a run there
       can have; a missing entry is unbounded (that point is never doomed by it).
    5. ``order``: the done runs' keys in the order they finished (default: ``runs`` order);
       it only chooses the run named.

    Each answer: ``run`` (the run named), ``mixture``, ``rate``, ``class``, ``metric``, the
    pooled ``over`` [k, n] and ``most_to_come`` N when it was settled, ``p_value`` and
    ``reason`` (see reason()). B0 is never doomed: it is the reference, not a candidate.
    """
    points: dict[tuple[str, str], list[int]] = defaultdict(list)
    for mix, rate, rep in agreed:
        points[(str(mix), str(rate))].append(int(rep))
    allowed = allowed_shares(classes)
    by_cell: dict[str, dict[Point, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        if not r.get("scenario"):
            by_cell[str(r["cell"])][(str(r["mixture"]), str(r["rate"]), int(r["repeat"]))].append(r)
    out: dict[str, dict[str, Any]] = {}
    for cell in cells:
        if cell == baseline or cell not in by_cell:
            continue
        by_point = by_cell[cell]
        done = [str(r["key"]) for rs in by_point.values() for r in rs if r["status"] == "done"]
        rank = {key: i for i, key in enumerate(order if order is not None else [str(r["key"]) for r in runs])}
        done.sort(key=lambda key: rank.get(key, len(rank)))
        judge = partial(
            _doomed_points, by_point, points=points, allowed=allowed, over=over, bounds=bounds, alpha=alpha
        )
        if not done or not judge(known=set(done)):
            continue
        known: set[str] = set()
        for key in done:
            known.add(key)
            found = judge(known=known)
            if found:
                first = found[0]
                out[cell] = {
                    "cell": cell,
                    "run": key,
                    **first,
                    "reason": reason(key, first["class"], first["metric"]),
                }
                break
    return out


def unusable(*, status: str, reason: str, lag_p99_ms: float | None, max_lag_ms: float | None) -> str | None:
    """Why a sweep run that has ended can never be a point's done run in the analysis, or None.

    Such a run makes its cell invalid (validity.validity_check): it ended ``invalid`` or
    ``failed`` (a run is retried only when its worker or host was lost, and then not through
    this path), or it is done with its load generator's dispatch lag p99 over the tolerance.
    A gate's answer is then inconclusive whatever its other runs show (apps/gate/verdict.py),
    so the gate stops there (``engine.stop_on_invalid``).
    """
    if status in ("invalid", "failed"):
        return f"{status}: {reason}" if reason else status
    if status == "done" and lag_over_tolerance(lag_p99_ms, max_lag_ms):
        return f"dispatch lag over tolerance (p99 {lag_p99_ms:g} ms > {max_lag_ms:g} ms)"
    return None
