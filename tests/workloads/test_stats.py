from __future__ import annotations

import bisect
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.workloads.importers import read_trace_file
from apps.workloads.stats import trace_stats


def _pct(values: list[int], q: float) -> float:
    # Linear interpolation between closest ranks (numpy's default), by hand.
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _cv(gaps: list[float]) -> float | None:
    if not gaps:
        return None
    mean = sum(gaps) / len(gaps)
    if mean == 0:
        return None
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    return math.sqrt(var) / mean


def reference_stats(times: list[float], inputs: list[int], outputs: list[int]) -> dict[str, Any]:
    """The issue's definitions, written as plain loops, independent of apps.workloads.stats."""
    rows = sorted(zip(times, inputs, outputs, strict=True), key=lambda r: r[0])  # sorted() is stable
    t = [r[0] for r in rows]
    n = len(t)
    duration = t[-1] - t[0]
    gaps = [t[i + 1] - t[i] for i in range(n - 1)]
    windows: dict[int, list[float]] = {}
    for x in t:
        windows.setdefault(int((x - t[0]) // 300), []).append(x)
    cvs = []
    for arrivals in windows.values():
        if len(arrivals) < 3:
            continue
        cv = _cv([arrivals[i + 1] - arrivals[i] for i in range(len(arrivals) - 1)])
        if cv is not None:
            cvs.append(cv)
    best_start, best_count = None, -1
    for i in range(n):
        count = bisect.bisect_left(t, t[i] + 300) - i
        if count > best_count:
            best_start, best_count = t[i] - t[0], count
    ins = [r[1] for r in rows]
    outs = [r[2] for r in rows]
    return {
        "requests": n,
        "duration_s": duration,
        "rate_rps": n / duration if duration > 0 else None,
        "cv_iat": _cv(gaps),
        "cv_iat_5min": {
            "median": statistics.median(cvs) if cvs else None,
            "max": max(cvs) if cvs else None,
        },
        "input_tokens": {"p50": _pct(ins, 50), "p90": _pct(ins, 90), "p99": _pct(ins, 99), "max": max(ins)},
        "output_tokens": {
            "p50": _pct(outs, 50),
            "p90": _pct(outs, 90),
            "p99": _pct(outs, 99),
            "max": max(outs),
        },
        "frac_input_gt_4096": sum(1 for x in ins if x > 4096) / n,
        "busiest_5min": {"start_offset_s": best_start, "requests": best_count},
    }


def _assert_agrees(got: dict[str, Any], want: dict[str, Any], path: str = "") -> None:
    assert set(got) == set(want), path
    for key, value in want.items():
        if isinstance(value, dict):
            _assert_agrees(got[key], value, f"{path}.{key}")
        elif value is None or (isinstance(value, int) and not isinstance(value, bool)):
            assert got[key] == value, f"{path}.{key}"
        else:
            # Agreement to far better than 6 significant digits.
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), f"{path}.{key}"


def test_it_reports_exactly_the_documented_keys() -> None:
    stats = trace_stats(np.array([0.0, 1.0, 3.0]), np.array([1, 2, 3]), np.array([4, 5, 6]))
    assert list(stats) == [
        "requests",
        "duration_s",
        "rate_rps",
        "cv_iat",
        "cv_iat_5min",
        "input_tokens",
        "output_tokens",
        "frac_input_gt_4096",
        "busiest_5min",
    ]
    assert set(stats["input_tokens"]) == {"p50", "p90", "p99", "max"}
    assert set(stats["busiest_5min"]) == {"start_offset_s", "requests"}


def test_it_agrees_with_a_loop_computation_on_bursty_unsorted_data() -> None:
    rng = np.random.default_rng(11)
    times = np.cumsum(rng.gamma(0.25, 4 * 0.5, size=4000))
    rng.shuffle(times)
    inputs = rng.integers(1, 9000, size=4000)
    outputs = rng.integers(1, 1000, size=4000)
    got = trace_stats(times, inputs, outputs)
    want = reference_stats(list(times), [int(x) for x in inputs], [int(x) for x in outputs])
    _assert_agrees(got, want)
    assert got["cv_iat"] > 1.5


def test_it_agrees_with_a_loop_computation_on_the_azure_trace(azure_conv: Path) -> None:
    trace = read_trace_file(azure_conv, fmt="azure")
    got = trace_stats(trace.t_s, trace.input_tokens, trace.output_tokens)
    assert got["requests"] == 19_366
    want = reference_stats(
        [float(x) for x in trace.t_s],
        [int(x) for x in trace.input_tokens],
        [int(x) for x in trace.output_tokens],
    )
    _assert_agrees(got, want)


def test_it_skips_windows_with_fewer_than_three_arrivals() -> None:
    # Window 0: 0, 1, 3 (CV of [1, 2] = 1/3); window 1: 300, 301 (skipped);
    # window 2: 600, 601, 602, 603 (CV 0).
    times = np.array([0.0, 1.0, 3.0, 300.0, 301.0, 600.0, 601.0, 602.0, 603.0])
    stats = trace_stats(times, np.ones(9, dtype=int), np.ones(9, dtype=int))
    assert stats["cv_iat_5min"]["max"] == pytest.approx(1 / 3)
    assert stats["cv_iat_5min"]["median"] == pytest.approx(1 / 6)


def test_it_picks_the_earliest_busiest_window() -> None:
    times = np.array([0.0, 100.0, 250.0, 400.0, 500.0, 650.0])
    stats = trace_stats(times, np.ones(6, dtype=int), np.ones(6, dtype=int))
    assert stats["busiest_5min"] == {"start_offset_s": 0.0, "requests": 3}


def test_it_counts_inputs_strictly_above_4096() -> None:
    stats = trace_stats(np.arange(4.0), np.array([4096, 4097, 10, 5000]), np.ones(4, dtype=int))
    assert stats["frac_input_gt_4096"] == 0.5


def test_it_reports_null_for_undefined_values() -> None:
    stats = trace_stats(np.array([5.0]), np.array([10]), np.array([3]))
    assert stats["requests"] == 1
    assert stats["duration_s"] == 0.0
    assert stats["rate_rps"] is None
    assert stats["cv_iat"] is None
    assert stats["cv_iat_5min"] == {"median": None, "max": None}
    assert stats["busiest_5min"] == {"start_offset_s": 0.0, "requests": 1}


def test_it_agrees_to_6_digits_with_an_independent_parse_of_the_azure_file(azure_conv: Path) -> None:
    import csv
    from datetime import datetime

    with azure_conv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    # datetime keeps microseconds only: a different parse, same numbers to 6 digits.
    stamps = [datetime.fromisoformat(r["TIMESTAMP"]).timestamp() for r in rows]
    want = reference_stats(
        [s - min(stamps) for s in stamps],
        [int(r["ContextTokens"]) for r in rows],
        [int(r["GeneratedTokens"]) for r in rows],
    )
    trace = read_trace_file(azure_conv, fmt="azure")
    got = trace_stats(trace.t_s, trace.input_tokens, trace.output_tokens)
    assert got["requests"] == want["requests"] == 19_366
    for key in ("duration_s", "rate_rps", "cv_iat", "frac_input_gt_4096"):
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    for key in ("median", "max"):
        assert got["cv_iat_5min"][key] == pytest.approx(want["cv_iat_5min"][key], rel=1e-6), key
    assert got["input_tokens"] == want["input_tokens"]
    assert got["output_tokens"] == want["output_tokens"]
    assert got["busiest_5min"]["requests"] == want["busiest_5min"]["requests"]
    assert got["busiest_5min"]["start_offset_s"] == pytest.approx(
        want["busiest_5min"]["start_offset_s"], rel=1e-6
    )


# Whole and half seconds put arrivals on window edges and make ties common.
_times = st.lists(st.integers(0, 4000).map(lambda x: x / 2), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(times=_times, data=st.data())
def test_it_agrees_with_the_loop_computation_on_edges_and_ties(
    times: list[float], data: st.DataObject
) -> None:
    n = len(times)
    inputs = data.draw(st.lists(st.integers(0, 9000), min_size=n, max_size=n))
    outputs = data.draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n))
    got = trace_stats(np.array(times), np.array(inputs), np.array(outputs))
    _assert_agrees(got, reference_stats(times, inputs, outputs))
