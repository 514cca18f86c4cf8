"""Paired comparison of a candidate with B0: seeded bootstrap CIs and material differences. Pure.

Every cell replayed the same trace in each (mixture, rate, repeat), so request
``index`` i of a candidate's run and of B0's run are the same request: the
comparison is paired. The bootstrap (docs/ANALYSIS.md) draws, per replicate,

1. the repeats with replacement (R of R), then
2. within each drawn repeat, the trace's cohort requests with replacement,

and applies the SAME draw to B0 and to the candidate, so the difference of a
replicate is a difference over identical traffic. The draws are seeded by the
options' seed and the (mixture, rate, class) key only: the same records always
give the same intervals, whichever order cells are analysed in.

Inter-token latency comes from merged per-request histograms, so only step 1
(repeats) is resampled for it; with few repeats its interval is wide, which
is honest.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.analysis.metrics import Derived
from workers.replay.records import GapHistogram

# metric -> True when higher is better.
HIGHER_IS_BETTER: dict[str, bool] = {
    "goodput_rps": True,
    "contract_share": True,
    "ttft_p99_ms": False,
    "e2e_p99_ms": False,
    "max_stall_p99_ms": False,
    "itl_p99_ms": False,
}
LATENCY_METRICS = ("ttft_p99_ms", "e2e_p99_ms", "max_stall_p99_ms", "itl_p99_ms")


def _default_abs() -> dict[str, float]:
    return {
        "goodput_rps": 0.01,
        "contract_share": 0.01,
        "ttft_p99_ms": 5.0,
        "e2e_p99_ms": 5.0,
        "max_stall_p99_ms": 5.0,
        "itl_p99_ms": 1.0,
    }


@dataclass(frozen=True)
class CompareOptions:
    resamples: int = 200
    seed: int = 0
    confidence: float = 0.95
    # A difference is material only when its interval excludes zero AND it is
    # larger than both of these (relative to B0's value, and absolute).
    min_effect_rel: float = 0.05
    min_effect_abs: Mapping[str, float] = field(default_factory=_default_abs)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> CompareOptions:
        data = dict(data or {})
        unknown = set(data) - {"resamples", "seed", "confidence", "min_effect_rel", "min_effect_abs"}
        if unknown:
            raise ValueError(f"unknown comparison options: {', '.join(sorted(unknown))}")
        abs_ = _default_abs()
        for k, v in dict(data.pop("min_effect_abs", {}) or {}).items():
            if k not in abs_:
                raise ValueError(f"min_effect_abs: unknown metric {k!r}")
            abs_[k] = float(v)
        opts = cls(min_effect_abs=abs_, **data)
        if opts.resamples < 10:
            raise ValueError("resamples must be at least 10")
        if not 0.5 < opts.confidence < 1:
            raise ValueError("confidence must be in (0.5, 1)")
        return opts

    def to_json(self) -> dict[str, Any]:
        return {
            "resamples": self.resamples,
            "seed": self.seed,
            "confidence": self.confidence,
            "min_effect_rel": self.min_effect_rel,
            "min_effect_abs": dict(self.min_effect_abs),
        }


def group_rng(options: CompareOptions, key: str) -> np.random.Generator:
    return np.random.default_rng([options.seed, zlib.crc32(key.encode())])


@dataclass
class Resampling:
    """Weights of every request per replicate: row 0 the full sample, rows 1..R each repeat alone,
    then the bootstrap replicates; columns are the repeats' frames concatenated."""

    counts: np.ndarray
    repeat_mult: np.ndarray  # (resamples, R): how often each repeat was drawn
    sizes: list[int]
    # Kept once per resampling, not per metric: requests per row, and the
    # counts as float32 for BLAS (exact: every sum stays below 2**24).
    totals: np.ndarray = field(init=False)
    counts_f: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.totals = self.counts.sum(axis=1, dtype=np.int64)
        self.counts_f = self.counts.astype(np.float32)

    @property
    def n_repeats(self) -> int:
        return len(self.sizes)


def resampling(sizes: Sequence[int], *, resamples: int, rng: np.random.Generator) -> Resampling:
    n_rep = len(sizes)
    total = int(sum(sizes))
    mult = np.zeros((resamples, n_rep), dtype=np.int64)
    if n_rep:
        picks = rng.integers(0, n_rep, size=(resamples, n_rep))
        for r in range(n_rep):
            mult[:, r] = (picks == r).sum(axis=1)
    boot = np.zeros((resamples, total), dtype=np.int32)
    offset = 0
    for r, n in enumerate(sizes):
        for k in range(n_rep):
            active = np.flatnonzero(mult[:, r] > k)
            if active.size == 0 or n == 0:
                continue
            draws = rng.integers(0, n, size=(active.size, n))
            flat = (np.arange(active.size)[:, None] * n + draws).ravel()
            boot[active, offset : offset + n] += np.bincount(flat, minlength=active.size * n).reshape(
                active.size, n
            )
        offset += n
    fixed = np.zeros((1 + n_rep, total), dtype=np.int32)
    fixed[0] = 1
    offset = 0
    for r, n in enumerate(sizes):
        fixed[1 + r, offset : offset + n] = 1
        offset += n
    return Resampling(counts=np.vstack([fixed, boot]), repeat_mult=mult, sizes=list(sizes))


def _quantile_full(sorted_v: np.ndarray, counts_sorted: np.ndarray, q: float) -> np.ndarray:
    cum = np.cumsum(counts_sorted, axis=1, dtype=np.int64)
    total = cum[:, -1]
    k = np.maximum(1, np.ceil(q * total - 1e-9)).astype(np.int64)
    pos = (cum < k[:, None]).sum(axis=1)
    out = np.full(counts_sorted.shape[0], np.nan)
    ok = total > 0
    out[ok] = sorted_v[np.minimum(pos[ok], len(sorted_v) - 1)]
    return out


def weighted_quantile(values: np.ndarray, rs: Resampling, q: float) -> np.ndarray:
    """Nearest-rank quantile of ``values`` under each row of ``rs.counts``; +inf ranks last.

    A high quantile of a resample almost always lies among the largest values,
    so the ranks are counted down from the top over a tail a few times wider
    than needed; the rare row whose quantile falls below that tail is
    recomputed over all values (the answer is exact either way: values that
    tie are equal, so their order never changes the result).
    """
    counts = rs.counts
    n = values.size
    if n == 0 or counts.shape[0] == 0:
        return np.full(counts.shape[0], np.nan)
    tail = n if q < 0.9 else min(n, max(64, int(math.ceil((1 - q) * n * 6))))
    if tail == n:
        order = np.argsort(values, kind="stable")
        return _quantile_full(values[order], counts[:, order], q)
    part = np.argpartition(values, n - tail)[n - tail :]
    top = part[np.argsort(values[part], kind="stable")][::-1]  # largest first
    total = rs.totals
    k = np.maximum(1, np.ceil(q * total - 1e-9)).astype(np.int64)
    # The k-th smallest is the (total - k + 1)-th largest.
    need = total - k + 1
    cum_top = np.cumsum(counts[:, top], axis=1, dtype=np.int32)
    pos = (cum_top < need[:, None]).sum(axis=1)
    out = np.full(counts.shape[0], np.nan)
    inside = (pos < tail) & (total > 0)
    out[inside] = values[top[pos[inside]]]
    rest = np.flatnonzero(~inside & (total > 0))
    if rest.size:
        order = np.argsort(values, kind="stable")
        out[rest] = _quantile_full(values[order], counts[rest][:, order], q)
    return out


def side_vectors(d: Derived, aligned: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Per-request values over the concatenated frames; a missing row (-1) is a failed request."""
    rows = np.concatenate(aligned) if aligned else np.zeros(0, dtype=np.int64)
    present = rows >= 0
    safe = np.where(present, rows, 0)

    def pick(arr: np.ndarray) -> np.ndarray:
        v = np.where(present, arr[safe], np.nan) if rows.size else np.zeros(0)
        return np.where(np.isnan(v), np.inf, v)

    good = np.where(present, d.good[safe], False) if rows.size else np.zeros(0, dtype=bool)
    return {
        "ttft_p99_ms": pick(d.ttft_ms),
        "e2e_p99_ms": pick(d.e2e_ms),
        "max_stall_p99_ms": pick(d.stall_ms),
        "good": good.astype(np.float64),
    }


def _metric_rows(
    vectors: dict[str, np.ndarray], rs: Resampling, obs_s: Sequence[float]
) -> dict[str, np.ndarray]:
    n_fixed = 1 + rs.n_repeats
    good = (rs.counts_f @ vectors["good"].astype(np.float32)).astype(np.float64)
    n_req = rs.totals.astype(np.float64)
    # Observation time behind each row: all repeats once (row 0), one repeat,
    # or the drawn repeats (bootstrap rows).
    obs = np.asarray(obs_s, dtype=np.float64)
    dur = np.concatenate([[obs.sum()], obs, rs.repeat_mult @ obs]) if obs.size else np.zeros(len(n_req))
    out = {
        "goodput_rps": np.divide(good, dur, out=np.zeros_like(good), where=dur > 0),
        "contract_share": np.divide(good, n_req, out=np.full_like(good, np.nan), where=n_req > 0),
    }
    for m in ("ttft_p99_ms", "e2e_p99_ms", "max_stall_p99_ms"):
        out[m] = weighted_quantile(vectors[m], rs, 0.99)
    assert all(v.shape[0] == n_fixed + rs.repeat_mult.shape[0] for v in out.values())
    return out


def _hist_rows(hists: Sequence[GapHistogram | None], rs: Resampling) -> np.ndarray:
    """ITL p99 (ms) for the full sample, each repeat, and each replicate of repeats."""
    n = rs.n_repeats
    buckets = sorted({b for h in hists if h is not None for b in h.counts})
    weights = np.zeros((n, len(buckets)))
    col = {b: i for i, b in enumerate(buckets)}
    for r, h in enumerate(hists):
        if h is not None:
            for b, c in h.counts.items():
                weights[r, col[b]] = c
    mult = np.vstack([np.ones((1, n)), np.eye(n), rs.repeat_mult]).astype(np.float64)
    merged = mult @ weights
    out = np.full(merged.shape[0], math.inf)
    if not buckets:
        return out
    cum = np.cumsum(merged, axis=1)
    total = cum[:, -1]
    # Same rule as GapHistogram.quantile: the first bucket whose running total reaches q * total.
    pos = np.minimum((cum < (0.99 * total)[:, None]).sum(axis=1), len(buckets) - 1)
    mids = np.asarray([GapHistogram({b: 1.0}).quantile(0.5) for b in buckets])
    ok = total > 0
    out[ok] = mids[pos[ok]] / 1000.0
    return out


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(round(x, 6))


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Both censored (inf - inf) gives NaN: the difference is unknown, not zero.
    with np.errstate(invalid="ignore"):
        return a - b


def judge(
    metric: str, cand: np.ndarray, base: np.ndarray, rs: Resampling, options: CompareOptions
) -> dict[str, Any]:
    """Point difference, CI, repeat variation and the material verdict of one metric."""
    n_rep = rs.n_repeats
    diffs = _diff(cand, base)
    point = float(diffs[0])
    boot = diffs[1 + n_rep :]
    known = boot[~np.isnan(boot)]
    alpha = (1 - options.confidence) / 2
    if known.size:
        lo, hi = (float(x) for x in np.quantile(known, [alpha, 1 - alpha], method="inverted_cdf"))
    else:
        lo = hi = math.nan
    rep = diffs[1 : 1 + n_rep]
    rep_known = rep[np.isfinite(rep)]
    b0 = float(base[0])
    threshold = options.min_effect_abs.get(metric, 0.0)
    if math.isfinite(b0):
        threshold = max(threshold, options.min_effect_rel * abs(b0))
    excludes_zero = (lo > 0 or hi < 0) if not math.isnan(lo) else False
    material = bool(excludes_zero and not math.isnan(point) and abs(point) > threshold)
    if material:
        better = (point > 0) == HIGHER_IS_BETTER[metric]
        direction = "better" if better else "worse"
    else:
        direction = "same"
    return {
        "b0": _num(b0),
        "candidate": _num(float(cand[0])),
        "b0_censored": math.isinf(b0),
        "candidate_censored": math.isinf(float(cand[0])),
        "diff": _num(point),
        "ci": [_num(lo), _num(hi)],
        "ci_unbounded": [math.isinf(lo), math.isinf(hi)],
        "b0_repeats": [_num(float(x)) for x in base[1 : 1 + n_rep]],
        "candidate_repeats": [_num(float(x)) for x in cand[1 : 1 + n_rep]],
        "repeat_diffs": [_num(float(x)) for x in rep],
        "repeat_std": _num(float(np.std(rep_known))) if rep_known.size > 1 else None,
        "repeat_range": [_num(float(rep_known.min())), _num(float(rep_known.max()))]
        if rep_known.size
        else None,
        "threshold": _num(threshold),
        "material": material,
        "direction": direction,
    }


def compare_class(
    d: Derived,
    *,
    rs: Resampling,
    base_aligned: Sequence[np.ndarray],
    cand_aligned: Sequence[np.ndarray],
    obs_s: Sequence[float],
    base_hists: Sequence[GapHistogram | None],
    cand_hists: Sequence[GapHistogram | None],
    options: CompareOptions,
) -> dict[str, dict[str, Any]]:
    """Every compared metric of one class: candidate - B0 over the shared traffic."""
    b = _metric_rows(side_vectors(d, base_aligned), rs, obs_s)
    c = _metric_rows(side_vectors(d, cand_aligned), rs, obs_s)
    b["itl_p99_ms"] = _hist_rows(base_hists, rs)
    c["itl_p99_ms"] = _hist_rows(cand_hists, rs)
    return {m: judge(m, c[m], b[m], rs, options) for m in HIGHER_IS_BETTER}


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
