"""The run-level side of a paired comparison: what the repeat rounds themselves say. Pure.

The bootstrap (apps/analysis/compare.py) draws requests within runs, so a whole run slower or
faster than the others is invisible to it. Every claim must also stand out from the spread
between whole runs: per (mixture, rate, class), each side's value of a metric in each repeat
round is fitted by the run-level model (inference.rounds_fit), and each claim is tested on the
rounds (inference.rounds_compare). compare.judge takes the larger of the bootstrap's and the
rounds' one-sided p-values and the hull of their intervals; the repeats' own worse test
(inference.repeats_p_worse) is reported beside them.

Here: the fits of one point (``point_fits``), the run-level test of one metric's two claims
(``round_claims``) and the per-repeat figures a verdict shows (``repeat_figures``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apps.analysis import inference

Fits = dict[str, inference.RoundsFit | None]  # metric -> the run-level model (None: no spread to estimate)


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(round(x, 6))


def point_fits(
    per_round: Mapping[str, Mapping[str, np.ndarray]],
    metrics: Sequence[str],
    cands: Sequence[str],
    pool: Collection[str] | None,
) -> tuple[Fits, dict[str, Fits]]:
    """(the pool's fits, cell -> the fits its comparison uses) of one point.

    ``per_round``: side ("" for B0, else the cell) -> metric -> its value in each round. The fit
    pools B0, the ``pool`` candidates (all when None) and the one compared, so a candidate outside
    the pool (one that cannot be adopted, whose runs early stopping may skip) never changes
    another's verdict."""
    pooled = ["", *(c for c in cands if pool is None or c in pool)]

    def fit_of(members: Sequence[str]) -> Fits:
        return {m: inference.rounds_fit({name: per_round[name][m] for name in members}) for m in metrics}

    fits = fit_of(pooled)
    return fits, {cell: fits if cell in pooled else fit_of([*pooled, cell]) for cell in cands}


@dataclass(frozen=True)
class RoundClaims:
    """The run-level test of one metric's two claims; without a fit no claim stands (both
    p-values 1, the interval unbounded)."""

    p_better: float
    p_worse: float
    lo: float  # the interval of candidate - B0 in the metric's units: its low end
    hi: float
    run_sd: float | None  # the spread between runs the test allowed for (the fit's scale)


def round_claims(
    fit: inference.RoundsFit | None,
    *,
    cand_hi: np.ndarray,
    cand_lo: np.ndarray,
    base_hi: np.ndarray,
    base_lo: np.ndarray,
    higher: bool,
    confidence: float,
    reference: float,
) -> RoundClaims:
    """Each claim tested on the ends it is tested at (per round: a censored tail's +inf or its
    lower bound, as the bootstrap does); ``reference`` is B0's value, for a log-scale interval
    in the metric's units."""
    by_better = by_worse = None
    if fit is not None:
        ends_better = (cand_hi, base_hi) if higher else (cand_hi, base_lo)
        ends_worse = (cand_hi, base_hi) if higher else (cand_lo, base_hi)
        by_better = inference.rounds_compare(
            fit, *ends_better, higher_is_better=higher, confidence=confidence
        )
        by_worse = inference.rounds_compare(fit, *ends_worse, higher_is_better=higher, confidence=confidence)
    used = by_worse if by_worse is not None and math.isfinite(by_worse.se) else by_better
    return RoundClaims(
        p_better=by_better.p_better if by_better is not None else 1.0,
        p_worse=by_worse.p_worse if by_worse is not None else 1.0,
        lo=in_units(by_worse.ci[0] if by_worse else -math.inf, fit, reference),
        hi=in_units(by_better.ci[1] if by_better else math.inf, fit, reference),
        run_sd=used.sd if used is not None else (fit.sd if fit is not None else None),
    )


def in_units(bound: float, fit: inference.RoundsFit | None, reference: float) -> float:
    """A run-level interval end (a log ratio, or a plain difference) as candidate - B0 in the metric's units."""
    if fit is None or not math.isfinite(bound):
        return bound
    if fit.scale == "plain":
        return bound
    if not math.isfinite(reference):
        return math.inf if bound > 0 else -math.inf
    return reference * math.expm1(bound)


def relative_sd(sd: float | None, fit: inference.RoundsFit | None) -> float | None:
    """A log-scale run spread as a relative one (0.25 -> 0.284: one run 28% off another's scale)."""
    if sd is None or fit is None or fit.scale != "log" or not math.isfinite(sd):
        return None
    return _num(math.expm1(sd))


@dataclass(frozen=True)
class RepeatFigures:
    """Each repeat's own difference, its spread, and the repeats' own worse test."""

    diffs: list[float | None]  # candidate - B0 per repeat (None: not finite)
    std: float | None
    range: list[float | None] | None
    p_worse: float | None  # inference.repeats_p_worse: a whole slow run, which the bootstrap cannot see
    sd_rel: float | None  # the spread between runs that test allowed for (the gate shows it)


def repeat_figures(
    diffs: np.ndarray, cand_ends: np.ndarray, base_hi: np.ndarray, *, higher: bool
) -> RepeatFigures:
    """``diffs``: candidate - B0 per repeat; ``cand_ends``: the candidate's per-repeat values on the
    end the worse test takes (its lower bound for a lower-is-better metric)."""
    known = diffs[np.isfinite(diffs)]
    p_worse = inference.repeats_p_worse(cand_ends, base_hi, higher_is_better=higher)
    sd = inference.repeats_pooled_sd(cand_ends, base_hi)
    return RepeatFigures(
        diffs=[_num(float(x)) for x in diffs],
        std=_num(float(np.std(known))) if known.size > 1 else None,
        range=[_num(float(known.min())), _num(float(known.max()))] if known.size else None,
        p_worse=None if p_worse is None else float(round(p_worse, 6)),
        sd_rel=None if sd is None else _num(math.expm1(sd)),
    )
