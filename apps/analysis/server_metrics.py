"""Server-side metrics of one run, from scraped /metrics samples. Pure.

Samples are dicts with the MetricSample fields (t_ns, phase, epoch, name,
labels, kind, value, histogram). ``epoch`` counts server restarts seen inside
the run: a counter delta is taken within one epoch only (last - first), never
across a restart, never negative, and the epochs' deltas are summed. The
increments between a restart and the first scrape after it are therefore not
counted: the delta is a lower bound when a run saw a restart, and the report
lists the restart boundaries next to it.
"""

from __future__ import annotations

import json
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
}
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
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


def server_metrics(samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counter deltas, gauge series and maxima, and restart boundaries of one run."""
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
            "series": _thin(series),
        }
    epochs = sorted(first_seen)
    out["restarts"] = [{"epoch": e, "t_s": round(first_seen[e] / 1e9, 3)} for e in epochs[1:]]
    out["samples"] = sum(len(v) for v in by_name.values())
    return out
