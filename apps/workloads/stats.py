"""Trace statistics with one fixed set of definitions.

Pure and vectorised (numpy). The definitions (docs/TRACES.md):

1. rows are sorted by arrival (stable) first; ``requests`` is their count;
   ``duration_s`` = last - first arrival; ``rate_rps`` = requests / duration_s;
2. inter-arrival times (IAT) are the differences of sorted arrivals;
   ``cv_iat`` = population std (ddof 0) / mean of the IATs;
3. ``cv_iat_5min`` = {median, max} over tumbling 300 s windows anchored at
   the first arrival of the CV of the IATs between consecutive arrivals
   inside each window; windows with fewer than 3 arrivals are skipped (and
   so is a window whose IATs are all 0, where the CV is undefined);
4. ``input_tokens`` / ``output_tokens`` = {p50, p90, p99, max}, numpy's
   default linear interpolation;
5. ``frac_input_gt_4096`` = share of rows with input strictly above 4096;
6. ``busiest_5min`` = {start_offset_s, requests} of the window
   [t_i, t_i + 300 s) opened at an arrival t_i holding the most requests,
   the earliest on ties, offset from the first arrival.

A value that is undefined (one request, zero duration) is ``None`` (JSON
null), never NaN or infinity.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from apps.workloads.tracefile import Trace

WINDOW_S = 300.0
LONG_INPUT_TOKENS = 4096


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _cv(values: np.ndarray) -> float | None:
    if len(values) == 0:
        return None
    mean = values.mean()
    if mean == 0:
        return None
    return _finite(values.std(ddof=0) / mean)


def _percentiles(values: np.ndarray) -> dict[str, float | int | None]:
    if len(values) == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": int(values.max())}


def windowed_cv(t: np.ndarray, *, window_s: float = WINDOW_S) -> np.ndarray:
    """CV of the IATs inside each tumbling window (sorted arrivals), one value per kept window.

    Steps: 1. window index of every arrival, anchored at the first;
    2. keep the IATs whose two arrivals share a window; 3. per-window mean
    then per-window squared deviation (two passes, no cancellation);
    4. drop windows with fewer than 3 arrivals or zero mean IAT.
    """
    if len(t) < 3:
        return np.zeros(0)
    # floor_divide matches Python's // exactly (a float quotient can round up
    # across a window edge).
    w = np.floor_divide(t - t[0], window_s).astype(np.int64)
    iat = np.diff(t)
    same = w[1:] == w[:-1]
    group = w[:-1][same]
    gaps = iat[same]
    n_windows = int(w[-1]) + 1
    arrivals = np.bincount(w, minlength=n_windows)
    count = np.bincount(group, minlength=n_windows).astype(np.float64)
    total = np.bincount(group, weights=gaps, minlength=n_windows)
    keep = arrivals >= 3
    mean = np.divide(total, count, out=np.zeros(n_windows), where=count > 0)
    dev = np.bincount(group, weights=(gaps - mean[group]) ** 2, minlength=n_windows)
    var = np.divide(dev, count, out=np.zeros(n_windows), where=count > 0)
    keep &= mean > 0
    return np.sqrt(var[keep]) / mean[keep]


def busiest_start(t: np.ndarray, length_s: float) -> tuple[int, int]:
    """(index i of the arrival opening the busiest [t_i, t_i + length_s), its count) over sorted
    arrivals; the earliest on ties."""
    ends = np.searchsorted(t, t + length_s, side="left")
    counts = ends - np.arange(len(t))
    best = int(np.argmax(counts))
    return best, int(counts[best])


def trace_stats(t_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray) -> dict[str, Any]:
    """The statistics object of a trace's arrival times (seconds) and token counts."""
    t = np.asarray(t_s, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order]
    inputs = np.asarray(input_tokens, dtype=np.int64)[order]
    outputs = np.asarray(output_tokens, dtype=np.int64)[order]
    n = len(t)
    duration = float(t[-1] - t[0]) if n else 0.0
    iat = np.diff(t)
    window_cvs = windowed_cv(t)
    busiest: dict[str, float | int | None] = {"start_offset_s": None, "requests": 0}
    if n:
        i, count = busiest_start(t, WINDOW_S)
        busiest = {"start_offset_s": float(t[i] - t[0]), "requests": count}
    return {
        "requests": n,
        "duration_s": duration,
        "rate_rps": n / duration if duration > 0 else None,
        "cv_iat": _cv(iat),
        "cv_iat_5min": {
            "median": float(np.median(window_cvs)) if len(window_cvs) else None,
            "max": float(window_cvs.max()) if len(window_cvs) else None,
        },
        "input_tokens": _percentiles(inputs),
        "output_tokens": _percentiles(outputs),
        "frac_input_gt_4096": float(np.mean(inputs > LONG_INPUT_TOKENS)) if n else None,
        "busiest_5min": busiest,
    }


def trace_file_stats(trace: Trace) -> dict[str, Any]:
    """The statistics of a canonical trace's planned arrivals and token counts."""
    return trace_stats(
        np.array([r.t_offset_s for r in trace.requests], dtype=np.float64),
        np.array([r.input_tokens for r in trace.requests], dtype=np.int64),
        np.array([r.output_tokens for r in trace.requests], dtype=np.int64),
    )
