"""The capacity probe's search: which rate to try next, what the capacity is, whether a step
passed, and the rates frozen from it. Pure (no Django): apps/lifecycle/calibration.py runs the
steps against the engine and the database, and tests/scenarios/test_calibration_search.py
checks the search alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def next_rate(
    *, history: Sequence[tuple[float, bool]], start_rps: float, tolerance: float, max_steps: int
) -> float | None:
    """The next rate to probe, or None when the search is over.

    1. No step yet: ``start_rps``.
    2. Every step passed: double the highest rate.
    3. A step failed: bisect between the highest pass below the lowest
       failure (0 if none) and that failure; stop once (hi - lo) / hi is
       within ``tolerance``.
    4. Never more than ``max_steps`` steps.
    """
    if len(history) >= max_steps:
        return None
    if not history:
        return float(start_rps)
    fails = [r for r, ok in history if not ok]
    if not fails:
        return max(r for r, _ in history) * 2.0
    hi = min(fails)
    lo = max((r for r, ok in history if ok and r < hi), default=0.0)
    if lo > 0 and (hi - lo) / hi <= tolerance:
        return None
    return round((lo + hi) / 2.0, 6)


def capacity_of(history: Sequence[tuple[float, bool]]) -> tuple[float | None, bool]:
    """(highest passing rate below the lowest failure, whether a failure bracketed it).

    A pass above a failure is noise at the edge: the capacity stays below
    every failure, so it is never overstated.
    """
    fails = [r for r, ok in history if not ok]
    ceiling = min(fails) if fails else float("inf")
    passes = [r for r, ok in history if ok and r < ceiling]
    return (max(passes) if passes else None), bool(fails)


def probe_passed(
    *,
    status: str,
    per_class: Mapping[str, Mapping[str, Any]],
    weights: Mapping[str, float],
    min_accepted_share: float,
) -> tuple[bool, list[str]]:
    """Did one probe step pass? Returns (passed, reasons it failed)."""
    reasons: list[str] = []
    if status != "done":
        reasons.append(f"run {status}")
    for name in sorted(n for n, w in weights.items() if w > 0):
        m = per_class.get(name)
        if m is None or not m["counts"]["offered"]:
            reasons.append(f"{name}: no requests in the window")
            continue
        verdict = m["contract"]
        if not verdict["met"]:
            broken = sorted(k for k, v in verdict.items() if v is False and k != "met")
            reasons.append(f"{name}: contract broken ({', '.join(broken) or verdict.get('reason', '?')})")
        share = m["accepted_share"]
        if share is None or share < min_accepted_share:
            reasons.append(f"{name}: accepted/offered {share} below {min_accepted_share}")
    return not reasons, reasons


def frozen_rates(*, capacity_rps: float, fractions: Mapping[str, float]) -> dict[str, float]:
    return {name: round(float(f) * capacity_rps, 4) for name, f in sorted(fractions.items())}
