"""A search's objective, its stopping rule and its selections. Pure: plain inputs, plain outputs.

The objective of a trial is the worst class's margin to its contract: for each class, its primary
metric (apps/analysis/family.primary_metrics) measured at the screening point, relative to the
contract's limit on that metric, ``(limit - p99) / limit``; the trial's margin is the smallest.
Positive: every class keeps its contract with that share to spare; negative: some class breaks
it. Throughput (completed requests per second) is the second objective: it breaks ties and marks
the Pareto front, it never buys a margin.

A trial that could not be measured (its server did not start, its run failed or was invalid) is
kept as data with its reason and scores ``FAILED_SCORE``, below any measured margin, so the
optimiser learns to avoid its region instead of proposing it again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A trial's outcome.
KEPT = "kept"  # every class kept its contract at the screening point
BROKE = "broke"  # measured, and some class broke its contract there
FAILED = "failed"  # no measurement: the server did not start, the run failed or was invalid
OUTCOMES = (KEPT, BROKE, FAILED)
# What the optimiser is told for a trial without a measurement; margins are clipped to [-1, 1].
FAILED_SCORE = -1.0
# Primary metric -> the contract key that limits it.
CONTRACT_OF = {"ttft_p99_ms": "ttft_p99_ms", "e2e_p99_ms": "e2e_p99_ms", "max_stall_p99_ms": "max_stall_ms"}


@dataclass(frozen=True)
class Trial:
    """One screened config as the search sees it (a SearchTrial row, or the bench's record)."""

    number: int
    params: Mapping[str, Any]
    outcome: str
    margin: float | None = None  # None: failed
    throughput: float | None = None
    engine_s: float = 0.0
    reason: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """What the optimiser maximises: the margin clipped to [-1, 1]; a failed trial the floor."""
        if self.margin is None or self.outcome == FAILED:
            return FAILED_SCORE
        return max(-1.0, min(1.0, self.margin))


def class_margin(value: float | None, limit: float) -> float:
    """``(limit - value) / limit``; a missing value (nothing completed) is the floor, -1."""
    if value is None or not math.isfinite(value):
        return -1.0
    return (limit - value) / limit if limit > 0 else -math.inf


def worst_margin(
    p99s: Mapping[str, Mapping[str, float | None]],
    contracts: Mapping[str, Mapping[str, float]],
    primaries: Mapping[str, str],
) -> tuple[float, str]:
    """(the smallest class margin, the class it belongs to), over the classes with a contract.

    ``p99s``: class -> {primary metric name: measured value}; ``contracts``: class -> its contract;
    ``primaries``: class -> its primary metric (a PRIMARY_CHOICES name).
    """
    worst = (math.inf, "")
    for cls in sorted(contracts):
        metric = primaries[cls]
        limit = float(contracts[cls][CONTRACT_OF[metric]])
        margin = class_margin((p99s.get(cls) or {}).get(metric), limit)
        worst = min(worst, (margin, cls))
    return worst


def outcome_of(margin: float | None) -> str:
    if margin is None:
        return FAILED
    return KEPT if margin >= 0 else BROKE


def best_k(trials: Sequence[Trial], k: int) -> list[Trial]:
    """The k measured trials with the largest margins (then throughput, then the earlier trial),
    each config once; trials that broke a contract only fill places the keepers leave."""
    seen: set[tuple[tuple[str, Any], ...]] = set()
    out: list[Trial] = []
    for t in sorted(
        (t for t in trials if t.outcome != FAILED and t.margin is not None),
        key=lambda t: (-(t.margin or 0.0), -(t.throughput or 0.0), t.number),
    ):
        key = tuple(sorted(t.params.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(t)
        if len(out) == k:
            break
    return out


def pareto_front(trials: Sequence[Trial]) -> list[int]:
    """The numbers of the measured trials no other trial beats on both margin and throughput."""
    measured = [t for t in trials if t.margin is not None and t.outcome != FAILED]
    front = []
    for t in measured:
        m, x = t.margin or 0.0, t.throughput or 0.0
        dominated = any(
            (o.margin or 0.0) >= m
            and (o.throughput or 0.0) >= x
            and ((o.margin or 0.0) > m or (o.throughput or 0.0) > x)
            for o in measured
        )
        if not dominated:
            front.append(t.number)
    return sorted(front)


def stop_reason(
    trials: Sequence[Trial], *, max_trials: int, max_engine_hours: float | None, patience: int | None
) -> str | None:
    """Why the screening stops now (None: propose another trial). Failed trials count toward
    every limit: they cost a server start and they are trials without improvement."""
    if len(trials) >= max_trials:
        return f"{len(trials)} trials, the budget's max_trials"
    spent = sum(t.engine_s for t in trials) / 3600.0
    if max_engine_hours is not None and spent >= max_engine_hours:
        return f"{spent:.2f} engine-hours spent, the budget's max_engine_hours is {max_engine_hours:g}"
    best = -math.inf
    since = 0
    for t in sorted(trials, key=lambda t: t.number):
        if t.score > best:
            best, since = t.score, 0
        else:
            since += 1
    if trials and patience is not None and since >= patience:
        return f"{since} trials without a better margin, the budget's patience"
    return None


def pick_confirmed(
    eligible: Sequence[str], margins: Mapping[str, float], *, baseline: float | None = None
) -> str | None:
    """Among the confirmed cells the verdict allows (``eligible``, in the verdict's own order),
    the one with the largest margin measured on the confirmation data, if that margin is above
    B0's (``baseline``, measured in the same rounds): the search's objective decides which allowed
    cell is proposed, so a larger goodput gain with a thinner margin does not win, and a cell the
    verdict allows for a gain on one class while its worst class has less to spare than under B0
    is not proposed (apps/analysis/decide.py takes ``margins`` for a search experiment). Ties keep
    the verdict's order; None: no such cell (the verdict's retain / isolate stands)."""
    ranked = [c for c in eligible if c in margins and (baseline is None or margins[c] > baseline)]
    if not ranked:
        return None
    return min(ranked, key=lambda cell: (-margins[cell], list(eligible).index(cell)))
