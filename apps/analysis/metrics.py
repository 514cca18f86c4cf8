"""Per run, per class metrics: cohort counts, censored percentiles, goodput. Pure (numpy only).

Definitions (docs/ANALYSIS.md says the same in prose):

- The cohort of a run is every non-warm-up request whose PLANNED arrival lies in
  the observation window [warmup_s, warmup_s + observation_s).
- Every latency is measured from the planned arrival, so a late load generator
  can never hide queueing; its lateness (sent - planned) is reported apart.
- Each cohort request falls in exactly one outcome, in this precedence:
  unsent, rejected (HTTP 429/503 or an admission error), timeout, error,
  cancelled, unfinished, completed.
- A value that was never observed (a rejected, failed or unfinished request has
  no end-to-end latency) is a censored observation: it ranks above every
  observed value, with the lower bound it is known to exceed (the drain
  deadline seen from its planned arrival). A percentile whose rank falls among
  them is reported as ``{"ms": None, "censored": True, "above_ms": bound}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.analysis.columns import ERROR_CODE, NO_ERROR, RecordTable
from apps.analysis.inference import judgeable_n
from workers.replay.records import GapHistogram

NS_PER_MS = 1_000_000.0
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
REJECT_STATUSES = (429, 503)

# Outcome codes, in precedence order (a lower code wins when several apply).
UNSENT, REJECTED, TIMEOUT, ERROR, CANCELLED, UNFINISHED, COMPLETED = range(7)
OUTCOMES = ("unsent", "rejected", "timeouts", "errors", "cancelled", "unfinished", "completed")


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int
    deadline_ns: int
    observation_s: float


def run_window(run: Mapping[str, Any]) -> Window:
    warm = float(run["warmup_s"])
    obs = float(run["observation_s"])
    drain = float(run["drain_deadline_s"])
    start = round(warm * 1e9)
    end = round((warm + obs) * 1e9)
    return Window(start_ns=start, end_ns=end, deadline_ns=end + round(drain * 1e9), observation_s=obs)


@dataclass(frozen=True)
class Contract:
    ttft_p99_ms: float
    e2e_p99_ms: float
    max_stall_ms: float
    error_rate: float

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Contract:
        try:
            return cls(
                ttft_p99_ms=float(data["ttft_p99_ms"]),
                e2e_p99_ms=float(data["e2e_p99_ms"]),
                max_stall_ms=float(data["max_stall_ms"]),
                error_rate=float(data["error_rate"]),
            )
        except KeyError as exc:
            raise ValueError(f"class contract is missing {exc.args[0]}") from None


@dataclass
class Derived:
    """Per-row facts of a RecordTable, computed once for every run and class."""

    table: RecordTable
    cohort: np.ndarray
    outcome: np.ndarray
    validated: np.ndarray
    good: np.ndarray
    late_completion: np.ndarray
    ttft_ms: np.ndarray  # NaN when not observed
    e2e_ms: np.ndarray
    stall_ms: np.ndarray
    # Lower bounds for the unobserved values above (ms).
    ttft_bound_ms: np.ndarray
    e2e_bound_ms: np.ndarray
    stall_bound_ms: np.ndarray
    lateness_ms: np.ndarray
    admission_ms: np.ndarray
    queue_age_ms: np.ndarray
    still_waiting: np.ndarray


def derive(
    table: RecordTable,
    windows: Mapping[str, Window],
    contracts: Mapping[str, Contract],
    *,
    natural: bool = False,
) -> Derived:
    """Classify every row and compute its latencies from the planned arrival.

    A completed request is *validated* when it got exactly its expected output tokens, or, in a
    natural-length replay (``natural``), at least one token and no more than its cap.

    Rows of runs without a window are outside every cohort; rows of a class
    without a contract can never be "good" (there is nothing to meet).
    """
    t = table
    n = len(t)
    start = np.full(len(t.run_keys), np.inf)
    end = np.full(len(t.run_keys), -np.inf)
    deadline = np.full(len(t.run_keys), np.nan)
    for i, key in enumerate(t.run_keys):
        w = windows.get(key)
        if w is not None:
            start[i], end[i], deadline[i] = w.start_ns, w.end_ns, w.deadline_ns
    r_start, r_end, r_deadline = start[t.run], end[t.run], deadline[t.run]
    planned = t.planned_ns
    cohort = (~t.warmup) & (planned >= r_start) & (planned < r_end)

    ek = t.error_kind
    status = t.http_status
    rejected = np.isin(status, REJECT_STATUSES) | (ek == ERROR_CODE["admission"])
    outcome = np.full(n, ERROR, dtype=np.int8)
    completed = t.sent & (ek == NO_ERROR) & ~t.cancelled & ~t.unfinished & (status == 200)
    # Assign from the lowest precedence up, so the highest one is written last.
    outcome[completed] = COMPLETED
    outcome[t.unfinished & (ek == NO_ERROR)] = UNFINISHED
    outcome[t.cancelled & (ek == NO_ERROR)] = CANCELLED
    outcome[(ek != NO_ERROR) & (ek != ERROR_CODE["timeout"])] = ERROR
    outcome[ek == ERROR_CODE["timeout"]] = TIMEOUT
    outcome[rejected] = REJECTED
    outcome[~t.sent] = UNSENT
    completed = outcome == COMPLETED

    if natural:
        validated = completed & (t.output_tokens >= 1) & (t.output_tokens <= t.expected_output_tokens)
    else:
        validated = completed & (t.output_tokens == t.expected_output_tokens)
    late_completion = completed & (t.end_ns >= r_end) & (t.end_ns <= r_deadline)

    to_deadline = (r_deadline - planned) / NS_PER_MS
    has_first = ~np.isnan(t.first_token_ns) & (outcome != UNSENT) & (outcome != REJECTED)
    ttft = np.where(has_first, (t.first_token_ns - planned) / NS_PER_MS, np.nan)
    e2e = np.where(completed, (t.end_ns - planned) / NS_PER_MS, np.nan)
    gap = np.where(np.isnan(t.max_gap_ns), 0.0, t.max_gap_ns / NS_PER_MS)
    stall = np.where(completed, gap, np.nan)
    # An unfinished stream has stalled at least since its last token.
    since_last = np.where(np.isnan(t.last_token_ns), to_deadline, (r_deadline - t.last_token_ns) / NS_PER_MS)
    stall_bound = np.where(outcome == UNFINISHED, np.maximum(gap, since_last), to_deadline)

    lateness = np.where(t.sent & ~np.isnan(t.sent_ns), (t.sent_ns - planned) / NS_PER_MS, np.nan)
    admission = t.admission_delay_ns / NS_PER_MS
    left_queue = np.where(has_first, t.first_token_ns, np.where(np.isnan(t.end_ns), r_deadline, t.end_ns))
    queue_age = (left_queue - planned) / NS_PER_MS
    still_waiting = ~has_first & (outcome == UNFINISHED)

    limits = np.full((len(t.class_names), 3), -np.inf)
    for i, name in enumerate(t.class_names):
        c = contracts.get(name)
        if c is not None:
            limits[i] = (c.ttft_p99_ms, c.e2e_p99_ms, c.max_stall_ms)
    lim = limits[t.cls] if n else np.zeros((0, 3))
    good = validated & (ttft <= lim[:, 0]) & (e2e <= lim[:, 1]) & (stall <= lim[:, 2])

    return Derived(
        table=t,
        cohort=cohort,
        outcome=outcome,
        validated=validated,
        good=good,
        late_completion=late_completion,
        ttft_ms=ttft,
        e2e_ms=e2e,
        stall_ms=stall,
        ttft_bound_ms=to_deadline,
        e2e_bound_ms=to_deadline,
        stall_bound_ms=stall_bound,
        lateness_ms=lateness,
        admission_ms=admission,
        queue_age_ms=queue_age,
        still_waiting=still_waiting,
    )


def cohort_groups(d: Derived) -> dict[tuple[str, str], np.ndarray]:
    """(run key, class) -> the table rows of that run's cohort of that class, in table order.

    One stable sort of the cohort rows by (run, class); every per-run and pooled metric is
    computed over these groups (apps/analysis/report.py, apps/analysis/early_stop.py).
    """
    table = d.table
    n_cls = max(1, len(table.class_names))
    rows = np.flatnonzero(d.cohort)
    gkey = table.run[rows] * n_cls + table.cls[rows]
    order = np.argsort(gkey, kind="stable")
    rows, gkey = rows[order], gkey[order]
    uniq, starts = np.unique(gkey, return_index=True)
    ends = np.append(starts[1:], rows.size) if starts.size else starts
    groups: dict[tuple[str, str], np.ndarray] = {}
    for g, s, e in zip(uniq.tolist(), starts.tolist(), ends.tolist(), strict=True):
        run_i, cls_i = divmod(g, n_cls)
        groups[(table.run_keys[run_i], table.class_names[cls_i])] = rows[s:e]
    return groups


def _ms(v: float) -> float:
    return float(round(float(v), 3))


def _no_value() -> dict[str, Any]:
    return {"ms": None, "censored": False, "above_ms": None}


def _observed(v: float) -> dict[str, Any]:
    return {"ms": _ms(v), "censored": False, "above_ms": None}


def _censored(v: float) -> dict[str, Any]:
    return {"ms": None, "censored": True, "above_ms": _ms(v)}


def censored_percentile(observed: np.ndarray, bounds: np.ndarray, q: float) -> dict[str, Any]:
    """Nearest-rank percentile with unobserved values ranked above all observed ones.

    1. n = observed + unobserved; the rank is k = ceil(q * n).
    2. If k falls among the observed values, the answer is the k-th smallest of
       them. It can only overstate the truth (unobserved values were pushed up).
    3. Otherwise the value is unknown; the k-th smallest of observed values and
       bounds together is a lower bound of it, reported as ``above_ms``.
    """
    n_obs = int(observed.size)
    n = n_obs + int(bounds.size)
    if n == 0:
        return _no_value()
    k = _rank(q, n)
    if k <= n_obs:
        return _observed(np.partition(observed, k - 1)[k - 1])
    union = np.concatenate([observed, bounds])
    return _censored(np.partition(union, k - 1)[k - 1])


def _rank(q: float, n: int) -> int:
    return max(1, math.ceil(q * n - 1e-9))


def pvalue(p: Mapping[str, Any] | None) -> float:
    """A percentile as a number for comparisons: censored or missing is +inf (worst)."""
    if p is None or p.get("censored") or p.get("ms") is None:
        return math.inf
    return float(p["ms"])


# p99.9, the tail the incident reported, is given only from enough requests for even the
# maximum to bound it (inference.judgeable_n(0.999) = 2,995): below that a "p99.9" would be the
# largest value read off as a percentile, so the report says "not enough requests" instead.
P999_NEED = judgeable_n(0.999)


def _p999_of(n: int, value: dict[str, Any] | None) -> dict[str, Any]:
    """The p99.9 entry of n requests, ``value`` its censored_percentile (None below P999_NEED)."""
    if n < P999_NEED or value is None:
        return {**_no_value(), "not_enough": True, "n": n, "need": P999_NEED}
    return {**value, "not_enough": False, "n": n}


def p999(observed: np.ndarray, bounds: np.ndarray) -> dict[str, Any]:
    """The p99.9 with the small-sample rule above: ``not_enough`` (and ``need``) below 2,995."""
    n = int(observed.size + bounds.size)
    return _p999_of(n, censored_percentile(observed, bounds, 0.999) if n >= P999_NEED else None)


def _percentiles(values: np.ndarray, bounds: np.ndarray) -> dict[str, Any]:
    """QUANTILES and the p99.9 of one cohort, as censored_percentile and p999 give them, from one
    partition of the observed values (and one of observed and bounds together where a rank falls
    past the observed): the same order statistics, a fifth of the partitions."""
    seen = ~np.isnan(values)
    obs = values[seen]
    bnd = bounds[~seen]
    n_obs = int(obs.size)
    n = n_obs + int(bnd.size)
    wanted = [*QUANTILES, *((("p999", 0.999),) if n >= P999_NEED else ())]
    ranks = {name: _rank(q, n) for name, q in wanted}
    low = sorted({k - 1 for k in ranks.values() if k <= n_obs})
    high = sorted({k - 1 for k in ranks.values() if k > n_obs})
    at_low = np.partition(obs, low) if low else obs
    at_high = np.partition(np.concatenate([obs, bnd]), high) if high else obs
    got = {
        name: _no_value() if n == 0 else _observed(at_low[k - 1]) if k <= n_obs else _censored(at_high[k - 1])
        for name, k in ranks.items()
    }
    out: dict[str, Any] = {name: got[name] for name, _ in QUANTILES}
    out["p999"] = _p999_of(n, got.get("p999"))
    out["observed"] = n_obs
    out["censored"] = int(bnd.size)
    return out


def plain_stats(values: np.ndarray) -> dict[str, Any]:
    v = values[~np.isnan(values)]
    if v.size == 0:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    p50, p99 = np.quantile(v, [0.5, 0.99], method="inverted_cdf")
    return {"p50": _ms(p50), "p99": _ms(p99), "max": _ms(v.max()), "n": int(v.size)}


def _hist_percentiles(hist: GapHistogram | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, q in QUANTILES:
        us = hist.quantile(q) if hist is not None else None
        out[name] = None if us is None else _ms(us / 1000.0)
    out["weight"] = float(round(hist.total, 3)) if hist is not None else 0.0
    return out


def cohort_histograms(d: Derived, *, which: str = "token_gaps") -> dict[tuple[str, str], GapHistogram]:
    """Merge the per-request gap histograms of each (run, class) cohort in one pass."""
    t = d.table
    flat = getattr(t, which)
    if flat is None or flat.row.size == 0:
        return {}
    n_cls = max(1, len(t.class_names))
    group = np.where(d.cohort, t.run * n_cls + t.cls, -1)
    g = group[flat.row]
    keep = g >= 0
    g, b, w = g[keep], flat.bucket[keep], flat.weight[keep]
    if g.size == 0:
        return {}
    nb = int(b.max()) + 1
    key = g * nb + b
    uniq, inv = np.unique(key, return_inverse=True)
    sums = np.bincount(inv, weights=w)
    out: dict[tuple[str, str], GapHistogram] = {}
    for k, s in zip(uniq.tolist(), sums.tolist(), strict=True):
        gid, bucket = divmod(k, nb)
        run_i, cls_i = divmod(gid, n_cls)
        h = out.setdefault((t.run_keys[run_i], t.class_names[cls_i]), GapHistogram())
        h.counts[bucket] = h.counts.get(bucket, 0.0) + s
    return out


def class_metrics(
    d: Derived,
    rows: np.ndarray,
    *,
    contract: Contract | None,
    observation_s: float,
    token_hist: GapHistogram | None = None,
    chunk_hist: GapHistogram | None = None,
) -> dict[str, Any]:
    """Every per-class metric of the given cohort rows (one run, or several repeats pooled)."""
    t = d.table
    outcome = d.outcome[rows]
    counts = {name: int(np.count_nonzero(outcome == code)) for code, name in enumerate(OUTCOMES)}
    offered = int(rows.size)
    validated = int(np.count_nonzero(d.validated[rows]))
    good = int(np.count_nonzero(d.good[rows]))
    counts.update(
        offered=offered,
        sent=offered - counts["unsent"],
        accepted=offered - counts["unsent"] - counts["rejected"],
        validated=validated,
        good=good,
        late_completions=int(np.count_nonzero(d.late_completion[rows])),
        still_waiting=int(np.count_nonzero(d.still_waiting[rows])),
    )
    # Client cancellations were asked for by the trace: they are neither
    # successes nor server failures, so they leave the error-rate base.
    failed = offered - validated - counts["cancelled"]
    base = offered - counts["cancelled"]
    error_rate = failed / base if base else 0.0
    ttft = _percentiles(d.ttft_ms[rows], d.ttft_bound_ms[rows])
    # A stream the client cancelled on purpose has no end to measure: it
    # leaves the end-to-end and stall populations (it is counted above).
    streamed = rows[outcome != CANCELLED]
    e2e = _percentiles(d.e2e_ms[streamed], d.e2e_bound_ms[streamed])
    stall = _percentiles(d.stall_ms[streamed], d.stall_bound_ms[streamed])
    stall_seen = d.stall_ms[rows]
    stall_seen = stall_seen[~np.isnan(stall_seen)]
    stall["max"] = _ms(stall_seen.max()) if stall_seen.size else None
    out_tokens = t.output_tokens[rows]
    queue_age = d.queue_age_ms[rows]
    queue_age = queue_age[~np.isnan(queue_age)]
    metrics: dict[str, Any] = {
        "counts": counts,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "itl_ms": _hist_percentiles(token_hist),
        "chunk_gap_ms": _hist_percentiles(chunk_hist),
        "max_stall_ms": stall,
        "lateness_ms": plain_stats(d.lateness_ms[rows]),
        "admission_delay_ms": plain_stats(d.admission_ms[rows]),
        "oldest_queue_age_ms": _ms(queue_age.max()) if queue_age.size else None,
        # Absent, never 0, when the class had no request to serve (or the window no length).
        "goodput_rps": float(round(good / observation_s, 6)) if offered and observation_s > 0 else None,
        "contract_share": float(round(good / offered, 6)) if offered else None,
        "accepted_share": float(round(counts["accepted"] / offered, 6)) if offered else None,
        "error_rate": float(round(error_rate, 6)),
        "output_tokens": int(np.nansum(out_tokens)),
        # Of the completed requests only: their mean length is what a natural-length replay compares.
        "completed_output_tokens": int(np.nansum(out_tokens[outcome == COMPLETED])),
        "observation_s": observation_s,
    }
    metrics["contract"] = contract_verdict(metrics, contract)
    if contract is not None:
        metrics["over_limit"] = over_limit(d, rows, streamed, contract, failed=failed, base=base)
    return metrics


def over_limit(
    d: Derived, rows: np.ndarray, streamed: np.ndarray, contract: Contract, *, failed: int, base: int
) -> dict[str, list[int]]:
    """[requests over the limit, requests judged] per contract limit; an unobserved value is over.

    TTFT is judged over every cohort request, end-to-end and max stall over the
    streams the client did not cancel, the error rate over offered − cancelled.
    """

    def count(values: np.ndarray, limit: float) -> list[int]:
        with np.errstate(invalid="ignore"):
            over = np.isnan(values) | (values > limit)
        return [int(np.count_nonzero(over)), int(values.size)]

    return {
        "ttft": count(d.ttft_ms[rows], contract.ttft_p99_ms),
        "e2e": count(d.e2e_ms[streamed], contract.e2e_p99_ms),
        "stall": count(d.stall_ms[streamed], contract.max_stall_ms),
        "error_rate": [int(failed), int(base)],
    }


def contract_verdict(metrics: Mapping[str, Any], contract: Contract | None) -> dict[str, Any]:
    """Does this class keep its contract here? Censored percentiles always break a limit."""
    if contract is None:
        return {"met": False, "reason": "no contract"}
    if metrics["counts"]["offered"] == 0:
        # No traffic of this class: nothing to keep, nothing broken.
        return {"met": True, "ttft": True, "e2e": True, "stall": True, "error_rate": True, "empty": True}
    checks = {
        "ttft": pvalue(metrics["ttft_ms"]["p99"]) <= contract.ttft_p99_ms,
        "e2e": pvalue(metrics["e2e_ms"]["p99"]) <= contract.e2e_p99_ms,
        "stall": pvalue(metrics["max_stall_ms"]["p99"]) <= contract.max_stall_ms,
        "error_rate": metrics["error_rate"] <= contract.error_rate,
    }
    return {"met": all(checks.values()), **checks}
