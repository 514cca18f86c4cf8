"""Server-side metrics of one run, from scraped /metrics samples. Pure.

Samples are dicts with the MetricSample fields (t_ns, phase, epoch, name,
labels, kind, value, histogram). ``epoch`` counts server restarts seen inside
the run: a counter delta is taken within one epoch only (last - first), never
across a restart, never negative, and the epochs' deltas are summed. The
increments between a restart and the first scrape after it are therefore not
counted: the delta is a lower bound when a run saw a restart, and the report
lists the restart boundaries next to it.

Histograms (vLLM's queue time, TTFT and prefill time, ``kind="histogram"`` with cumulative
``[le, count]`` buckets) are taken the same way, bucket by bucket: the requests the server
finished inside the run's scrapes, every class and the replay's warm-up requests together.
``histogram_quantile`` reads a quantile off such buckets (apps/analysis/ttft_parts.py uses them
where no per-request span joined).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

# Report key -> metric names that carry it (vLLM renamed a few over releases;
# a counter may be stored with or without the exposition's "_total" suffix).
COUNTERS: dict[str, tuple[str, ...]] = {
    "preemptions": ("vllm:num_preemptions",),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "request_success": ("vllm:request_success",),
    "admission_rejections": ("vllm:admission_rejections",),
    # Prompt tokens looked up in the prefix cache and found there (per server, not per request).
    "prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits",),
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "queue_time": ("vllm:request_queue_time_seconds",),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "prefill_time": ("vllm:request_prefill_time_seconds",),
}
# Chart-ready series keep at most this many points (the maxima survive thinning).
MAX_POINTS = 120


def _base(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def counter_delta(samples: Iterable[Mapping[str, Any]]) -> float | None:
    """Sum over label sets and epochs of (last - first) within each epoch; None without samples."""
    series: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for s in samples:
        if s.get("value") is None:
            continue
        labels = json.dumps(s.get("labels") or {}, sort_keys=True)
        series[(labels, int(s.get("epoch") or 0))].append((int(s["t_ns"]), float(s["value"])))
    if not series:
        return None
    total = 0.0
    for points in series.values():
        points.sort()
        total += max(0.0, points[-1][1] - points[0][1])
    return total


def _le(value: Any) -> float:
    return math.inf if value in ("+Inf", "Inf", "inf") else float(value)


def histogram_delta(samples: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The requests a histogram counted during the run: per label set and epoch, the last scrape's
    cumulative buckets minus the first's (never negative), summed; None without histogram samples.

    Returns ``{"buckets": [[le, cumulative count], ...], "count": n, "sum": seconds}`` with ``le``
    in seconds and "+Inf" spelled as in the scrape.
    """
    series: dict[tuple[str, int], list[tuple[int, Mapping[str, Any]]]] = defaultdict(list)
    for s in samples:
        h = s.get("histogram")
        if not isinstance(h, Mapping) or not h.get("buckets"):
            continue
        labels = json.dumps(s.get("labels") or {}, sort_keys=True)
        series[(labels, int(s.get("epoch") or 0))].append((int(s["t_ns"]), h))
    if not series:
        return None
    buckets: dict[float, float] = defaultdict(float)
    count = total = 0.0
    for points in series.values():
        points.sort(key=lambda p: p[0])
        first, last = points[0][1], points[-1][1]
        before = {_le(le): float(c) for le, c in first["buckets"]}
        for le, c in last["buckets"]:
            buckets[_le(le)] += max(0.0, float(c) - before.get(_le(le), 0.0))
        count += max(0.0, float(last.get("count") or 0.0) - float(first.get("count") or 0.0))
        total += max(0.0, float(last.get("sum") or 0.0) - float(first.get("sum") or 0.0))
    return {
        "buckets": [["+Inf" if math.isinf(le) else le, c] for le, c in sorted(buckets.items())],
        "count": count,
        "sum": round(total, 9),
    }


def merge_histograms(hists: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """Deltas of several runs added bucket by bucket (their buckets must be vLLM's same bounds)."""
    buckets: dict[float, float] = defaultdict(float)
    count = total = 0.0
    seen = False
    for h in hists:
        if not h:
            continue
        seen = True
        for le, c in h["buckets"]:
            buckets[_le(le)] += float(c)
        count += float(h.get("count") or 0.0)
        total += float(h.get("sum") or 0.0)
    if not seen:
        return None
    return {
        "buckets": [["+Inf" if math.isinf(le) else le, c] for le, c in sorted(buckets.items())],
        "count": count,
        "sum": total,
    }


def histogram_quantile(hist: Mapping[str, Any] | None, q: float) -> dict[str, Any] | None:
    """Quantile q of cumulative buckets, in ms, as Prometheus reads one: linear within the bucket
    the rank falls in (from 0 for the first). ``above`` is set when the rank falls in the +Inf
    bucket: then ``ms`` is the largest finite bound, a lower bound. None without counts.
    """
    if not hist:
        return None
    points = sorted(((_le(le), float(c)) for le, c in hist["buckets"]), key=lambda p: p[0])
    total = points[-1][1] if points else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cum in points:
        if cum >= rank:
            if math.isinf(le):
                return {"ms": round(lower * 1000.0, 3), "above": True}
            inside = cum - below
            frac = (rank - below) / inside if inside > 0 else 1.0
            return {"ms": round((lower + (le - lower) * frac) * 1000.0, 3), "above": False}
        lower, below = (le if not math.isinf(le) else lower), cum
    return {"ms": round(lower * 1000.0, 3), "above": True}


def _thin(points: list[list[float]]) -> list[list[float]]:
    if len(points) <= MAX_POINTS:
        return points
    # Keep each bin's maximum, so a spike is never thinned away.
    step = len(points) / MAX_POINTS
    out = []
    for i in range(MAX_POINTS):
        chunk = points[int(i * step) : int((i + 1) * step)] or [points[-1]]
        out.append(max(chunk, key=lambda p: (p[1], -p[0])))
    return out


def gauge_series(samples: Iterable[Mapping[str, Any]]) -> list[list[float]]:
    """[[t_s, value], ...] in time order, label sets summed at each scrape."""
    by_t: dict[int, float] = defaultdict(float)
    for s in samples:
        if s.get("value") is not None:
            by_t[int(s["t_ns"])] += float(s["value"])
    return [[round(t / 1e9, 3), round(v, 6)] for t, v in sorted(by_t.items())]


def _mean(series: list[list[float]]) -> float | None:
    return round(sum(v for _, v in series) / len(series), 6) if series else None


def server_metrics(samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counter deltas, gauge series and maxima, histogram deltas and restart boundaries of one run."""
    by_name: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    first_seen: dict[int, int] = {}
    for s in samples:
        by_name[_base(str(s["name"]))].append(s)
        epoch = int(s.get("epoch") or 0)
        t = int(s["t_ns"])
        if epoch not in first_seen or t < first_seen[epoch]:
            first_seen[epoch] = t
    out: dict[str, Any] = {"counters": {}, "gauges": {}}
    for key, names in COUNTERS.items():
        picked = [s for n in names for s in by_name.get(n, [])]
        out["counters"][key] = counter_delta(picked)
    for key, names in GAUGES.items():
        name = next((n for n in names if by_name.get(n)), None)
        series = gauge_series(by_name[name]) if name else []
        out["gauges"][key] = {
            "max": max((v for _, v in series), default=None),
            # Over the measured window's scrapes, before thinning (the ITL-versus-batch relation).
            "mean": _mean(gauge_series(s for s in by_name[name] if s.get("phase") == "during"))
            if name
            else None,
            "series": _thin(series),
        }
    out["histograms"] = {
        key: histogram_delta([s for n in names for s in by_name.get(n, [])])
        for key, names in HISTOGRAMS.items()
    }
    epochs = sorted(first_seen)
    out["restarts"] = [{"epoch": e, "t_s": round(first_seen[e] / 1e9, 3)} for e in epochs[1:]]
    out["samples"] = sum(len(v) for v in by_name.values())
    return out
