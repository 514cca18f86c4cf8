"""Paired comparison of candidates with B0: a two-stage block bootstrap and one-sided tests. Pure.

Every cell replayed the same trace in each (mixture, rate, repeat), so request
``index`` i of a candidate's run and of B0's run are the same request: the
comparison is paired. Per (mixture, rate, class) the bootstrap
(docs/ANALYSIS.md, "How much the verdict can be trusted") draws, per replicate,

1. the repeats with replacement (R of R), then
2. within each drawn repeat, blocks of consecutive requests in arrival order
   (circular, ``inference.block_length`` long) until the run's size is reached,

and applies the SAME draw to B0 and to every candidate. Blocks keep the
queueing correlation of neighbouring requests inside a replicate, which
independent draws would break (and so understate the noise).

Censoring is handled one-sidedly. A value that was not observed has a lower
bound (metrics.Derived); testing "better" uses B0's lower bound against the
candidate's +inf, testing "worse" the mirror image, so a draw where both sides
are censored supports neither claim.

Each metric gets one-sided bootstrap p-values for "better" and "worse"; the
gain family and Holm's adjustment are applied afterwards (apps/analysis/family.py).
Draws are seeded by the options' seed and the (mixture, rate, class) key only.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.analysis import inference
from apps.analysis.metrics import Derived
from apps.analysis.report_types import CompareOptionsJSON, MetricVerdict
from apps.analysis.resample import Resampling, TailQuantile
from workers.replay.records import GapHistogram

# Tail metrics per request: kind -> the Derived fields of its value and lower bound.
LATENCY_KINDS: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_ms", "ttft_bound_ms"),
    "e2e": ("e2e_ms", "e2e_bound_ms"),
    "max_stall": ("stall_ms", "stall_bound_ms"),
}
LEVELS = ("p99", "p95")


def latency_metric(kind: str, level: str) -> str:
    return f"{kind}_{level}_ms"


def metric_kind(metric: str) -> str | None:
    """'e2e_p95_ms' -> 'e2e'; None for a metric that is not a per-request tail."""
    for kind in LATENCY_KINDS:
        if metric.startswith(kind + "_p"):
            return kind
    return None


# metric -> True when higher is better.
HIGHER_IS_BETTER: dict[str, bool] = {
    "goodput_rps": True,
    "contract_share": True,
    **{latency_metric(k, lv): False for lv in LEVELS for k in LATENCY_KINDS},
    "itl_p99_ms": False,
}
PRIMARY_CHOICES = tuple(latency_metric(k, "p99") for k in LATENCY_KINDS)


def _default_abs() -> dict[str, float]:
    out = {"goodput_rps": 0.01, "contract_share": 0.01, "itl_p99_ms": 1.0}
    out.update({latency_metric(k, lv): 5.0 for lv in LEVELS for k in LATENCY_KINDS})
    return out


OPTION_KEYS = frozenset(
    {
        "resamples",
        "seed",
        "confidence",
        "min_effect_rel",
        "min_effect_abs",
        "family_alpha",
        "noninferiority_margin_rel",
        "contract_alpha",
        "itl_min_repeats",
        "seed_check",
    }
)
MIN_RESAMPLES = 2000


@dataclass(frozen=True)
class CompareOptions:
    # Bootstrap draws: at least this many, more as the gain family grows (inference.family_resamples).
    resamples: int = MIN_RESAMPLES
    seed: int = 0
    # The interval shown and the "materially worse" guard (two-sided, uncorrected).
    confidence: float = 0.95
    # A difference is material only when it is larger than both of these
    # (relative to B0's value, and absolute) as well as significant.
    min_effect_rel: float = 0.05
    min_effect_abs: Mapping[str, float] = field(default_factory=_default_abs)
    # Family-wise error rate of the gains a retune rests on (Holm).
    family_alpha: float = 0.05
    # Non-inferiority: the interval's upper end of every class's primary metric
    # must stay below B0 x (1 + this).
    noninferiority_margin_rel: float = 0.25
    # Exact binomial test of a contract limit: broken when the share over it is above
    # the allowed share with confidence 1 - this.
    contract_alpha: float = 0.05
    # Inter-token latency is resampled by repeat only: below this many repeats it is never material.
    itl_min_repeats: int = 5
    # Repeat the comparison under a second seed and mark what changes "borderline".
    seed_check: bool = True

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> CompareOptions:
        data = dict(data or {})
        unknown = set(data) - OPTION_KEYS
        if unknown:
            raise ValueError(f"unknown comparison options: {', '.join(sorted(unknown))}")
        abs_ = _default_abs()
        given = dict(data.pop("min_effect_abs", {}) or {})
        for k, v in given.items():
            if k not in abs_:
                raise ValueError(f"min_effect_abs: unknown metric {k!r}")
            abs_[k] = float(v)
        # A p95 fallback takes its p99's minimum effect unless it is given itself.
        for k, v in given.items():
            twin = k.replace("_p99_", "_p95_")
            if k.endswith("_p99_ms") and twin in abs_ and twin not in given:
                abs_[twin] = float(v)
        opts = cls(min_effect_abs=abs_, **data)
        if opts.resamples < MIN_RESAMPLES:
            raise ValueError(f"resamples must be at least {MIN_RESAMPLES}")
        if not 0.5 < opts.confidence < 1:
            raise ValueError("confidence must be in (0.5, 1)")
        for name in ("family_alpha", "contract_alpha"):
            if not 0 < getattr(opts, name) < 0.5:
                raise ValueError(f"{name} must be in (0, 0.5)")
        if not 0 < opts.noninferiority_margin_rel <= 1:
            raise ValueError("noninferiority_margin_rel must be in (0, 1]")
        if opts.itl_min_repeats < 2:
            raise ValueError("itl_min_repeats must be at least 2")
        return opts

    def to_json(self) -> CompareOptionsJSON:
        return {
            "resamples": self.resamples,
            "seed": self.seed,
            "confidence": self.confidence,
            "min_effect_rel": self.min_effect_rel,
            "min_effect_abs": dict(self.min_effect_abs),
            "family_alpha": self.family_alpha,
            "noninferiority_margin_rel": self.noninferiority_margin_rel,
            "contract_alpha": self.contract_alpha,
            "itl_min_repeats": self.itl_min_repeats,
            "seed_check": self.seed_check,
        }


def group_seed(seed: int, key: str) -> list[int]:
    return [seed, zlib.crc32(key.encode())]


@dataclass
class Side:
    """One cell's per-request vectors over the concatenated frames."""

    good: np.ndarray
    hi: dict[str, np.ndarray]  # unobserved -> +inf
    lo: dict[str, np.ndarray]  # unobserved -> its lower bound (the same array when nothing is censored)


def side_vectors(d: Derived, aligned: Sequence[np.ndarray]) -> Side:
    """A missing row (-1: the cell lacks the request) is a failed request: +inf on both ends."""
    rows = np.concatenate(aligned) if aligned else np.zeros(0, dtype=np.int64)
    present = rows >= 0
    safe = np.where(present, rows, 0)
    hi: dict[str, np.ndarray] = {}
    lo: dict[str, np.ndarray] = {}
    for kind, (value_field, bound_field) in LATENCY_KINDS.items():
        if rows.size == 0:
            hi[kind] = lo[kind] = np.zeros(0)
            continue
        v = np.where(present, getattr(d, value_field)[safe], np.nan)
        bound = np.where(present, getattr(d, bound_field)[safe], np.inf)
        seen = ~np.isnan(v)
        hi[kind] = np.where(seen, v, np.inf)
        lo[kind] = hi[kind] if seen.all() else np.where(seen, v, bound)
    good = np.where(present, d.good[safe], False) if rows.size else np.zeros(0, dtype=bool)
    return Side(good=good.astype(np.float32), hi=hi, lo=lo)


def _hist_rows(hists: Sequence[GapHistogram | None], mult: np.ndarray) -> np.ndarray:
    """ITL p99 (ms) for each row of repeat multiplicities."""
    n = len(hists)
    buckets = sorted({b for h in hists if h is not None for b in h.counts})
    out = np.full(mult.shape[0], math.inf)
    if not buckets:
        return out
    weights = np.zeros((n, len(buckets)))
    col = {b: i for i, b in enumerate(buckets)}
    for r, h in enumerate(hists):
        if h is not None:
            for b, c in h.counts.items():
                weights[r, col[b]] = c
    merged = mult.astype(np.float64) @ weights
    cum = np.cumsum(merged, axis=1)
    total = cum[:, -1]
    # Same rule as GapHistogram.quantile: the first bucket whose running total reaches q * total.
    pos = np.minimum((cum < (0.99 * total)[:, None]).sum(axis=1), len(buckets) - 1)
    mids = np.asarray([GapHistogram({b: 1.0}).quantile(0.5) for b in buckets])
    ok = total > 0
    out[ok] = mids[pos[ok]] / 1000.0
    return out


@dataclass
class Rows:
    """A metric of one side over every row: fixed rows first (full, each repeat), then replicates."""

    hi: np.ndarray
    lo: np.ndarray


def _rows_of_sides(
    sides: Mapping[str, Side],
    rs: Resampling,
    *,
    levels: Sequence[str],
    obs_s: Sequence[float],
    hists: Mapping[str, Sequence[GapHistogram | None]],
) -> dict[str, dict[str, Rows]]:
    """Every side's metrics over the fixed rows and every replicate, in one pass over the draws."""
    quantiles = {
        name: {
            (kind, level, end): TailQuantile(vec, inference.QUANTILE_OF_LEVEL[level])
            for kind in LATENCY_KINDS
            for level in levels
            for end, vec in (("hi", side.hi[kind]), ("lo", side.lo[kind]))
            if end == "hi" or side.lo[kind] is not side.hi[kind]
        }
        for name, side in sides.items()
    }
    obs = np.asarray(obs_s, dtype=np.float64)
    parts: dict[str, dict[str, list[np.ndarray]]] = {name: {} for name in sides}

    def add(name: str, metric: str, value: np.ndarray) -> None:
        parts[name].setdefault(metric, []).append(value)

    def rates(name: str, good: np.ndarray, total: np.ndarray, dur: np.ndarray) -> None:
        add(name, "goodput_rps", np.divide(good, dur, out=np.zeros_like(good), where=dur > 0))
        add(name, "contract_share", np.divide(good, total, out=np.full_like(good, np.nan), where=total > 0))

    sizes = np.asarray(rs.sizes, dtype=np.int64)
    goods = np.stack([side.good.astype(np.float32) for side in sides.values()], axis=1)
    mults = []
    for counts, mult in itertools.chain([(rs.fixed(), rs.fixed_mult())], rs.chunks()):
        mults.append(mult)
        total = mult @ sizes  # each drawn repeat contributes exactly its size
        dur = mult @ obs if obs.size else np.zeros(counts.shape[0])
        # One pass over the counts for every side's good requests (exact in float32 below 2**24).
        good_all = (counts.astype(np.float32) @ goods).astype(np.float64)
        for i, name in enumerate(sides):
            rates(name, good_all[:, i], total, dur)
            for (kind, level, end), tq in quantiles[name].items():
                add(name, f"{latency_metric(kind, level)}:{end}", tq.of(counts, total))
    all_mult = np.vstack(mults)
    out: dict[str, dict[str, Rows]] = {}
    for name in sides:
        got = {k: np.concatenate(v) for k, v in parts[name].items()}
        mine = {m: Rows(hi=got[m], lo=got[m]) for m in ("goodput_rps", "contract_share")}
        for kind in LATENCY_KINDS:
            for level in levels:
                m = latency_metric(kind, level)
                mine[m] = Rows(hi=got[f"{m}:hi"], lo=got.get(f"{m}:lo", got[f"{m}:hi"]))
        itl = _hist_rows(hists[name], all_mult)
        mine["itl_p99_ms"] = Rows(hi=itl, lo=itl)
        out[name] = mine
    return out


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(round(x, 6))


def _q(values: np.ndarray, p: float) -> float:
    return float(np.quantile(values, p, method="inverted_cdf")) if values.size else math.nan


def material_threshold(metric: str, reference: float, options: CompareOptions) -> float:
    """The smallest difference that counts as material: the metric's absolute minimum effect,
    or the relative one of B0's value (``reference``) when that is larger."""
    threshold = options.min_effect_abs.get(metric, 0.0)
    if math.isfinite(reference):
        threshold = max(threshold, options.min_effect_rel * abs(reference))
    return threshold


def judge(
    metric: str,
    cand: Rows,
    base: Rows,
    *,
    n_rep: int,
    options: CompareOptions,
    fit: inference.RoundsFit | None = None,
    judged: bool = True,
    note: str | None = None,
) -> MetricVerdict:
    """Point difference, interval, one-sided p-values, the worse guard and non-inferiority of one metric.

    "Harm" is candidate − B0 for a lower-is-better metric and B0 − candidate
    otherwise. For the better test the harm is taken at its largest (candidate's
    +inf, B0's lower bound), for the worse test at its smallest (the mirror), so
    censored draws never support a claim. ``direction`` is "worse" (guard,
    uncorrected), else "same"; "better" is set by the gain family (family.py).

    Every claim must also stand out from the spread between whole runs: ``fit`` is the
    run-level model of the point (inference.rounds_fit), and each one-sided p-value is the
    larger of the bootstrap's and the run-level test's (inference.rounds_compare), the
    interval the hull of both. Without a fit (one repeat, or no two cells with every round
    known) no claim stands: both run-level p-values are 1 and the interval is unbounded.
    """
    higher = HIGHER_IS_BETTER[metric]
    with np.errstate(invalid="ignore"):
        if higher:
            h_better = base.hi - cand.hi
            h_worse = h_better
        else:
            h_better = cand.hi - base.lo
            h_worse = cand.lo - base.hi
    h_better = np.where(np.isnan(h_better), np.inf, h_better)
    h_worse = np.where(np.isnan(h_worse), -np.inf, h_worse)
    boot_b, boot_w = h_better[1 + n_rep :], h_worse[1 + n_rep :]
    draws = int(boot_b.size)
    a2 = (1 - options.confidence) / 2
    p_better_boot = (1 + int(np.count_nonzero(boot_b >= 0))) / (draws + 1)
    p_worse_boot = (1 + int(np.count_nonzero(boot_w <= 0))) / (draws + 1)
    harm_lo, harm_hi = _q(boot_w, a2), _q(boot_b, 1 - a2)
    with np.errstate(invalid="ignore"):
        diffs = cand.hi - base.hi
    point = float(diffs[0])
    b0, b0_lo = float(base.hi[0]), float(base.lo[0])
    reference = b0 if math.isfinite(b0) else b0_lo
    # The run-level test on each repeat's own value, on the ends each claim is tested at.
    reps = slice(1, 1 + n_rep)
    by_better = by_worse = None
    if fit is not None:
        ends_better = (cand.hi[reps], base.hi[reps]) if higher else (cand.hi[reps], base.lo[reps])
        ends_worse = (cand.hi[reps], base.hi[reps]) if higher else (cand.lo[reps], base.hi[reps])
        by_better = inference.rounds_compare(
            fit, *ends_better, higher_is_better=higher, confidence=options.confidence
        )
        by_worse = inference.rounds_compare(
            fit, *ends_worse, higher_is_better=higher, confidence=options.confidence
        )
    p_better_rounds = by_better.p_better if by_better is not None else 1.0
    p_worse_rounds = by_worse.p_worse if by_worse is not None else 1.0
    p_better = max(p_better_boot, p_better_rounds)
    p_worse = max(p_worse_boot, p_worse_rounds)
    # The interval of candidate - B0 (harm for a lower-is-better metric): the hull of both.
    round_lo = _in_units(by_worse.ci[0] if by_worse else -math.inf, fit, reference)
    round_hi = _in_units(by_better.ci[1] if by_better else math.inf, fit, reference)
    if higher:
        # harm = B0 - candidate: its low end is minus the high end of candidate - B0.
        harm_lo, harm_hi = min(harm_lo, -round_hi), max(harm_hi, -round_lo)
    else:
        harm_lo, harm_hi = min(harm_lo, round_lo), max(harm_hi, round_hi)
    ci = [-harm_hi, -harm_lo] if higher else [harm_lo, harm_hi]
    threshold = material_threshold(metric, reference, options)
    improvement, harm = -float(h_better[0]), float(h_worse[0])
    worse = bool(judged and p_worse <= a2 and harm > threshold)
    used = by_worse if by_worse is not None and math.isfinite(by_worse.se) else by_better
    run_sd = used.sd if used is not None else (fit.sd if fit is not None else None)
    margin = options.noninferiority_margin_rel * abs(reference) if math.isfinite(reference) else math.nan
    noninferior = bool(judged and math.isfinite(margin) and harm_hi < margin) if not higher else None
    rep = diffs[1 : 1 + n_rep]
    rep_known = rep[np.isfinite(rep)]
    # The same worse test on the repeats' own values: a whole run slower than the others is
    # invisible to the bootstrap, which draws requests within runs (inference.repeats_p_worse).
    p_worse_repeats = inference.repeats_p_worse(
        (cand.hi if higher else cand.lo)[1 : 1 + n_rep], base.hi[1 : 1 + n_rep], higher_is_better=higher
    )
    # The spread between runs that test allowed for (the gate shows it: apps/gate/verdict.py).
    repeats_sd = inference.repeats_pooled_sd((cand.hi if higher else cand.lo)[reps], base.hi[reps])
    return {
        "b0": _num(b0),
        "candidate": _num(float(cand.hi[0])),
        "b0_censored": math.isinf(b0),
        "candidate_censored": math.isinf(float(cand.hi[0])),
        "b0_above": _num(b0_lo) if math.isinf(b0) else None,
        "candidate_above": _num(float(cand.lo[0])) if math.isinf(float(cand.hi[0])) else None,
        "diff": _num(point),
        "ci": [_num(ci[0]), _num(ci[1])],
        "ci_unbounded": [math.isinf(ci[0]), math.isinf(ci[1])],
        "b0_repeats": [_num(float(x)) for x in base.hi[1 : 1 + n_rep]],
        "candidate_repeats": [_num(float(x)) for x in cand.hi[1 : 1 + n_rep]],
        "repeat_diffs": [_num(float(x)) for x in rep],
        "repeat_std": _num(float(np.std(rep_known))) if rep_known.size > 1 else None,
        "repeat_range": [_num(float(rep_known.min())), _num(float(rep_known.max()))]
        if rep_known.size
        else None,
        "threshold": _num(threshold),
        "improvement": _num(improvement),
        "harm": _num(harm),
        "p_better": float(round(p_better, 6)),
        "p_worse": float(round(p_worse, 6)),
        "p_worse_repeats": None if p_worse_repeats is None else float(round(p_worse_repeats, 6)),
        "repeats_sd_rel": None if repeats_sd is None else _num(math.expm1(repeats_sd)),
        "p_better_bootstrap": float(round(p_better_boot, 6)),
        "p_worse_bootstrap": float(round(p_worse_boot, 6)),
        "p_better_rounds": float(round(p_better_rounds, 6)),
        "p_worse_rounds": float(round(p_worse_rounds, 6)),
        "run_sd": _num(run_sd) if run_sd is not None else None,
        "run_sd_rel": _relative(run_sd, fit),
        "rounds_df": fit.df if fit is not None else None,
        "rounds_scale": fit.scale if fit is not None else None,
        "draws": draws,
        "noninferior": noninferior,
        "noninferiority_margin": _num(margin),
        "judged": judged,
        "note": note,
        "worse": worse,
        "material": worse,
        "direction": "worse" if worse else "same",
    }


def _in_units(bound: float, fit: inference.RoundsFit | None, reference: float) -> float:
    """A run-level interval end (a log ratio, or a plain difference) as candidate - B0 in the metric's units."""
    if fit is None or not math.isfinite(bound):
        return bound
    if fit.scale == "plain":
        return bound
    if not math.isfinite(reference):
        return math.inf if bound > 0 else -math.inf
    return reference * math.expm1(bound)


def _relative(sd: float | None, fit: inference.RoundsFit | None) -> float | None:
    """A log-scale run spread as a relative one (0.25 -> 0.284: one run 28% off another's scale)."""
    if sd is None or fit is None or fit.scale != "log" or not math.isfinite(sd):
        return None
    return _num(math.expm1(sd))


def b0_spread(rows: Rows, n_rep: int) -> float:
    """Robust bootstrap standard error of B0's own value: half the 16-84% range of its replicates."""
    boot = rows.hi[1 + n_rep :]
    if boot.size == 0:
        return math.nan
    lo, hi = _q(boot, 0.158655), _q(boot, 0.841345)
    return (hi - lo) / 2 if math.isfinite(lo) and math.isfinite(hi) else math.inf


@dataclass
class GroupResult:
    """Every candidate's judged metrics of one (mixture, rate, class), and B0's own spread."""

    metrics: dict[str, dict[str, MetricVerdict]]  # cell -> metric -> its verdict
    levels: list[str]
    b0: dict[str, float]
    b0_se: dict[str, float]
    # metric -> the run-level model (None: no spread between runs to estimate)
    fits: dict[str, inference.RoundsFit | None] = field(default_factory=dict)  # over B0 and the pool
    cell_fits: dict[str, dict[str, inference.RoundsFit | None]] = field(default_factory=dict)
    b0_repeats: dict[str, np.ndarray] = field(default_factory=dict)  # metric -> B0's per-repeat values
    repeats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # cell -> metric -> per repeat


def compare_group(
    d: Derived,
    *,
    rs: Resampling,
    cls: str,
    base_aligned: Sequence[np.ndarray],
    cands: Mapping[str, Sequence[np.ndarray]],
    obs_s: Sequence[float],
    base_hists: Sequence[GapHistogram | None],
    cand_hists: Mapping[str, Sequence[GapHistogram | None]],
    options: CompareOptions,
    incomplete: str | None = None,
    pool: Collection[str] | None = None,
) -> GroupResult:
    """Candidate − B0 for every candidate over the shared traffic of one (mixture, rate, class).

    1. The tail level judged: p99 when the pooled requests reach judgeable_n(0.99),
       else p95 (the p99 entries stay, marked not judged), else none.
    2. One pass over the replicates computes every side's metrics on the same draws.
    3. The run-level model of each metric is fitted to every side's per-repeat values
       (inference.rounds_fit): the spread between whole runs each claim must stand out from.
       The fit pools B0, the ``pool`` candidates (all when None) and the one compared, so a
       candidate outside the pool (one that cannot be adopted, whose runs early stopping may
       skip) never changes another's verdict.
    4. Each metric is judged (judge); ITL is not judged below itl_min_repeats repeats, nothing
       below two repeats (no spread between runs to compare with), nothing when
       ``incomplete`` says why (a candidate that finished fewer repeats than the design asks).
    """
    n = rs.total
    n_rep = rs.n_repeats
    level = inference.judged_level(n)
    levels = ["p99"] if level == "p99" else ["p99", "p95"]
    sides = {"": side_vectors(d, base_aligned)}
    sides.update({cell: side_vectors(d, aligned) for cell, aligned in cands.items()})
    rows = _rows_of_sides(sides, rs, levels=levels, obs_s=obs_s, hists={"": base_hists, **dict(cand_hists)})
    notes: dict[str, str | None] = {}
    for kind in LATENCY_KINDS:
        for lv in levels:
            need = inference.judgeable_n(inference.QUANTILE_OF_LEVEL[lv])
            notes[latency_metric(kind, lv)] = (
                None if n >= need else f"not enough requests to judge {cls} {kind} {lv} (n={n} < {need})"
            )
    if n_rep < options.itl_min_repeats:
        notes["itl_p99_ms"] = (
            f"inter-token latency is resampled by repeat only: with {n_rep} repeats "
            f"(< {options.itl_min_repeats}) it is never called material"
        )
    if n_rep < 2:
        for m in rows[""]:
            notes[m] = notes.get(m) or (
                f"one repeat: the spread between whole runs cannot be estimated, so no {cls} "
                "difference is called material"
            )
    if incomplete:
        notes = {m: incomplete for m in rows[""]}
    # The run-level model: B0, the ``pool`` cells and the one compared. Where a side's tail was
    # never observed in a round, its lower bound stands in for it.
    per_round = {
        name: {m: np.where(np.isfinite(r.hi), r.hi, r.lo)[1 : 1 + n_rep] for m, r in by_metric.items()}
        for name, by_metric in rows.items()
    }
    pooled = ["", *(c for c in cands if pool is None or c in pool)]

    def fit_of(members: Sequence[str]) -> dict[str, inference.RoundsFit | None]:
        return {m: inference.rounds_fit({name: per_round[name][m] for name in members}) for m in rows[""]}

    fits = fit_of(pooled)
    cell_fits = {cell: fits if cell in pooled else fit_of([*pooled, cell]) for cell in cands}
    out: dict[str, dict[str, MetricVerdict]] = {}
    for cell in cands:
        out[cell] = {
            m: judge(
                m,
                rows[cell][m],
                rows[""][m],
                n_rep=n_rep,
                options=options,
                fit=cell_fits[cell][m],
                judged=notes.get(m) is None,
                note=notes.get(m),
            )
            for m in rows[""]
        }
    return GroupResult(
        metrics=out,
        levels=[level] if level else [],
        b0={m: float(r.hi[0]) for m, r in rows[""].items()},
        b0_se={m: b0_spread(r, n_rep) for m, r in rows[""].items()},
        fits=fits,
        cell_fits=cell_fits,
        b0_repeats={m: r.hi[1 : 1 + n_rep] for m, r in rows[""].items()},
        repeats={cell: {m: r.hi[1 : 1 + n_rep] for m, r in rows[cell].items()} for cell in cands},
    )


def align(frame_index: np.ndarray, rows: np.ndarray | None, index: np.ndarray) -> np.ndarray:
    """Table rows of a run matched to the frame's request indices (-1 where the run lacks one)."""
    if rows is None or rows.size == 0:
        return np.full(frame_index.size, -1, dtype=np.int64)
    idx = index[rows]
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    pos = np.searchsorted(sorted_idx, frame_index)
    pos_c = np.minimum(pos, sorted_idx.size - 1)
    hit = sorted_idx[pos_c] == frame_index
    return np.where(hit, rows[order][pos_c], -1)
