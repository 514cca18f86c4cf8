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

The metrics compared and the options are apps/analysis/compare_options.py; what the repeat
rounds themselves say (the run-level model each claim must also stand out from) is
apps/analysis/rounds.py.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from apps.analysis import inference, rounds
from apps.analysis.compare_options import HIGHER_IS_BETTER, LATENCY_KINDS, CompareOptions, latency_metric
from apps.analysis.metrics import Derived
from apps.analysis.report_types import MetricVerdict
from apps.analysis.resample import FusedReplicates, Resampling, TailCache, TailQuantile
from workers.replay.records import GapHistogram

# The replicates go through the fused kernel while every replicate holds fewer requests than this:
# the numpy path's float32 product counts good requests exactly only below 2**24.
FUSED_MAX_TOTAL = 2**24


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
    out = np.full(mult.shape[0], math.inf)
    held = [(r, h.counts) for r, h in enumerate(hists) if h is not None and h.counts]
    if not held:
        return out
    keys = {r: np.fromiter(c.keys(), dtype=np.int64, count=len(c)) for r, c in held}
    buckets = np.unique(np.concatenate(list(keys.values())))
    weights = np.zeros((n, buckets.size))
    for r, c in held:
        weights[r, np.searchsorted(buckets, keys[r])] = np.fromiter(
            c.values(), dtype=np.float64, count=len(c)
        )
    merged = mult.astype(np.float64) @ weights
    cum = np.cumsum(merged, axis=1)
    total = cum[:, -1]
    # Same rule as GapHistogram.quantile: the first bucket whose running total reaches q * total.
    pos = np.minimum((cum < (0.99 * total)[:, None]).sum(axis=1), buckets.size - 1)
    mids = np.asarray([_bucket_mid(int(b)) for b in buckets])
    ok = total > 0
    out[ok] = mids[pos[ok]] / 1000.0
    return out


@functools.lru_cache(maxsize=4096)
def _bucket_mid(bucket: int) -> float:
    """A gap bucket's middle in microseconds, as GapHistogram.quantile reads it."""
    value = GapHistogram({bucket: 1.0}).quantile(0.5)
    return math.inf if value is None else value


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
    tails: TailCache | None = None,
) -> dict[str, dict[str, Rows]]:
    """Every side's metrics over the fixed rows and every replicate, in one pass over the draws.

    ``tails``: TailQuantiles kept from an earlier call on the same point (the second seed's pass
    reads the first's), each used only where its values equal this side's."""

    def tail(name: str, kind: str, level: str, end: str, vec: np.ndarray) -> TailQuantile:
        q = inference.QUANTILE_OF_LEVEL[level]
        return TailQuantile(vec, q) if tails is None else tails.quantile((name, kind, level, end), vec, q)

    quantiles = {
        name: {
            (kind, level, end): tail(name, kind, level, end, vec)
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
    flat = [(name, key, tq) for name in sides for key, tq in quantiles[name].items()]
    mults = []

    def record(mult: np.ndarray, total: np.ndarray, good_all: np.ndarray, qs: Sequence[np.ndarray]) -> None:
        mults.append(mult)
        dur = mult @ obs if obs.size else np.zeros(mult.shape[0])
        for i, name in enumerate(sides):
            rates(name, good_all[:, i], total, dur)
        for (name, (kind, level, end), _), values in zip(flat, qs, strict=True):
            add(name, f"{latency_metric(kind, level)}:{end}", values)

    def counted(counts: np.ndarray, mult: np.ndarray) -> None:
        total = mult @ sizes  # each drawn repeat contributes exactly its size
        # One pass over the counts for every side's good requests (exact in float32 below 2**24).
        good_all = (counts.astype(np.float32) @ goods).astype(np.float64)
        # Positions as rows: each tail quantile reads its top positions as whole rows.
        counts_t = np.ascontiguousarray(counts.T)
        record(mult, total, good_all, [tq.of_t(counts_t, total) for _, _, tq in flat])

    counted(rs.fixed(), rs.fixed_mult())
    # The replicates by the fused kernel (resample.FusedReplicates: the same numbers without the
    # count matrix) while a replicate's good count is exact in float32 as the numpy path's is.
    if rs.n_repeats and rs.n_repeats * int(sizes.max()) < FUSED_MAX_TOTAL:
        fused = FusedReplicates(rs, goods, [tq for _, _, tq in flat])
        for d in rs.draws():
            total = d.mult @ sizes
            good_all, qs = fused.of(d, total)
            record(d.mult, total, good_all, list(qs.T))
    else:
        for counts, mult in rs.chunks():
            counted(counts, mult)
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


@dataclass(frozen=True)
class _Bootstrap:
    """The bootstrap's side of one metric's claims. "Harm" is candidate - B0 for a lower-is-better
    metric and B0 - candidate otherwise, per row (the full data's first): at its largest for the
    better test (candidate's +inf, B0's lower bound), at its smallest for the worse test."""

    h_better: np.ndarray
    h_worse: np.ndarray
    draws: int
    p_better: float
    p_worse: float
    harm_lo: float  # the harm's interval over the replicates
    harm_hi: float


def _bootstrap(cand: Rows, base: Rows, *, n_rep: int, higher: bool, confidence: float) -> _Bootstrap:
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
    a2 = (1 - confidence) / 2
    return _Bootstrap(
        h_better=h_better,
        h_worse=h_worse,
        draws=draws,
        p_better=(1 + int(np.count_nonzero(boot_b >= 0))) / (draws + 1),
        p_worse=(1 + int(np.count_nonzero(boot_w <= 0))) / (draws + 1),
        harm_lo=_q(boot_w, a2),
        harm_hi=_q(boot_b, 1 - a2),
    )


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
    larger of the bootstrap's and the run-level test's (rounds.round_claims), the
    interval the hull of both. Without a fit (one repeat, or no two cells with every round
    known) no claim stands: both run-level p-values are 1 and the interval is unbounded.
    """
    higher = HIGHER_IS_BETTER[metric]
    boot = _bootstrap(cand, base, n_rep=n_rep, higher=higher, confidence=options.confidence)
    with np.errstate(invalid="ignore"):
        diffs = cand.hi - base.hi
    b0, b0_lo = float(base.hi[0]), float(base.lo[0])
    reference = b0 if math.isfinite(b0) else b0_lo
    # The run-level test on each repeat's own value, on the ends each claim is tested at.
    reps = slice(1, 1 + n_rep)
    run = rounds.round_claims(
        fit,
        cand_hi=cand.hi[reps],
        cand_lo=cand.lo[reps],
        base_hi=base.hi[reps],
        base_lo=base.lo[reps],
        higher=higher,
        confidence=options.confidence,
        reference=reference,
    )
    p_better = max(boot.p_better, run.p_better)
    p_worse = max(boot.p_worse, run.p_worse)
    # The interval of candidate - B0 (harm for a lower-is-better metric): the hull of both.
    if higher:
        # harm = B0 - candidate: its low end is minus the high end of candidate - B0.
        harm_lo, harm_hi = min(boot.harm_lo, -run.hi), max(boot.harm_hi, -run.lo)
    else:
        harm_lo, harm_hi = min(boot.harm_lo, run.lo), max(boot.harm_hi, run.hi)
    ci = [-harm_hi, -harm_lo] if higher else [harm_lo, harm_hi]
    threshold = material_threshold(metric, reference, options)
    improvement, harm = -float(boot.h_better[0]), float(boot.h_worse[0])
    worse = bool(judged and p_worse <= (1 - options.confidence) / 2 and harm > threshold)
    margin = options.noninferiority_margin_rel * abs(reference) if math.isfinite(reference) else math.nan
    noninferior = bool(judged and math.isfinite(margin) and harm_hi < margin) if not higher else None
    # The repeats' own values: a whole run slower than the others is invisible to the bootstrap,
    # which draws requests within runs (inference.repeats_p_worse).
    repeats = rounds.repeat_figures(
        diffs[reps], (cand.hi if higher else cand.lo)[reps], base.hi[reps], higher=higher
    )
    return {
        "b0": _num(b0),
        "candidate": _num(float(cand.hi[0])),
        "b0_censored": math.isinf(b0),
        "candidate_censored": math.isinf(float(cand.hi[0])),
        "b0_above": _num(b0_lo) if math.isinf(b0) else None,
        "candidate_above": _num(float(cand.lo[0])) if math.isinf(float(cand.hi[0])) else None,
        "diff": _num(float(diffs[0])),
        "ci": [_num(ci[0]), _num(ci[1])],
        "ci_unbounded": [math.isinf(ci[0]), math.isinf(ci[1])],
        "b0_repeats": [_num(float(x)) for x in base.hi[reps]],
        "candidate_repeats": [_num(float(x)) for x in cand.hi[reps]],
        "repeat_diffs": repeats.diffs,
        "repeat_std": repeats.std,
        "repeat_range": repeats.range,
        "threshold": _num(threshold),
        "improvement": _num(improvement),
        "harm": _num(harm),
        "p_better": float(round(p_better, 6)),
        "p_worse": float(round(p_worse, 6)),
        "p_worse_repeats": repeats.p_worse,
        "repeats_sd_rel": repeats.sd_rel,
        "p_better_bootstrap": float(round(boot.p_better, 6)),
        "p_worse_bootstrap": float(round(boot.p_worse, 6)),
        "p_better_rounds": float(round(run.p_better, 6)),
        "p_worse_rounds": float(round(run.p_worse, 6)),
        "run_sd": _num(run.run_sd) if run.run_sd is not None else None,
        "run_sd_rel": rounds.relative_sd(run.run_sd, fit),
        "rounds_df": fit.df if fit is not None else None,
        "rounds_scale": fit.scale if fit is not None else None,
        "draws": boot.draws,
        "noninferior": noninferior,
        "noninferiority_margin": _num(margin),
        "judged": judged,
        "note": note,
        "worse": worse,
        "material": worse,
        "direction": "worse" if worse else "same",
    }


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
    tails: TailCache | None = None,
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
    rows = _rows_of_sides(
        sides, rs, levels=levels, obs_s=obs_s, hists={"": base_hists, **dict(cand_hists)}, tails=tails
    )
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
    fits, cell_fits = rounds.point_fits(per_round, list(rows[""]), list(cands), pool)
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
