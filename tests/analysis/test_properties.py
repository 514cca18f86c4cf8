"""Invariants of the analysis, checked with hypothesis."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.analysis.metrics import censored_percentile, pvalue
from tests.analysis.builders import request
from tests.analysis.test_metrics import analyse, planned

latencies = st.lists(st.tuples(st.floats(1.0, 3000.0), st.floats(0.5, 400.0)), min_size=1, max_size=60)


def records(lat, shift_ms=0.0, drop=frozenset()):
    out = []
    for i, (ttft, stall) in enumerate(lat):
        if i in drop:
            # Dropped from the finished set: it never completed by the drain deadline.
            out.append(request("r1", i, "short", planned(i), ttft_ms=None, unfinished=True))
        else:
            out.append(
                request("r1", i, "short", planned(i), ttft_ms=ttft + shift_ms, stall_ms=stall + shift_ms)
            )
    return out


@settings(max_examples=60, deadline=None)
@given(lat=latencies, k=st.integers(1, 10))
def test_it_never_raises_goodput_or_lowers_a_p99_when_the_slowest_requests_are_dropped(lat, k):
    before = analyse(records(lat))
    e2e = [before_ttft + 15 * 10.0 for before_ttft, _ in lat]
    slowest = frozenset(int(i) for i in np.argsort(e2e, kind="stable")[::-1][:k])
    after = analyse(records(lat, drop=slowest))
    assert after["goodput_rps"] <= before["goodput_rps"]
    assert after["contract_share"] <= before["contract_share"]
    for metric in ("ttft_ms", "e2e_ms", "max_stall_ms"):
        assert pvalue(after[metric]["p99"]) >= pvalue(before[metric]["p99"])


@settings(max_examples=60, deadline=None)
@given(lat=latencies, shift=st.floats(0.0, 2000.0))
def test_it_never_improves_a_verdict_when_every_latency_shifts_up(lat, shift):
    before = analyse(records(lat))
    after = analyse(records(lat, shift_ms=shift))
    assert after["goodput_rps"] <= before["goodput_rps"]
    for key in ("ttft", "e2e", "stall", "met"):
        assert before["contract"][key] or not after["contract"][key]
    for metric in ("ttft_ms", "e2e_ms", "max_stall_ms"):
        assert pvalue(after[metric]["p99"]) >= pvalue(before[metric]["p99"])


@settings(max_examples=200, deadline=None)
@given(
    observed=st.lists(st.floats(0.0, 1e6), max_size=50),
    bounds=st.lists(st.floats(0.0, 1e6), min_size=1, max_size=50),
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99, 1.0]),
)
def test_it_never_puts_a_censored_percentile_below_the_censored_bound(observed, bounds, q):
    obs, bnd = np.asarray(observed), np.asarray(bounds)
    p = censored_percentile(obs, bnd, q)
    n = obs.size + bnd.size
    k = math.ceil(q * n - 1e-9)
    if k > obs.size:
        assert p["censored"] and p["ms"] is None
        assert p["above_ms"] >= round(bnd.min(), 3)
    else:
        assert not p["censored"]
        # Unobserved values only ever push a percentile up, never down.
        assert p["ms"] >= round(np.sort(np.concatenate([obs, bnd]))[k - 1], 3) - 1e-9


@settings(max_examples=15, deadline=None)
@given(
    ttft=st.tuples(st.floats(10.0, 700.0), st.floats(10.0, 700.0), st.floats(10.0, 700.0)),
    shift=st.floats(0.0, 500.0),
)
def test_it_never_lets_a_cell_pass_or_leave_isolation_after_every_latency_shifts_up(ttft, shift):
    from dataclasses import replace

    from tests.analysis.builders import Plan, build

    per_cell = dict(zip(("B0", "C1", "C2"), ttft, strict=True))
    plan = replace(Plan(), repeats=2, per_class=20)

    def behaviour(extra):
        return lambda cell, mix, rate, rep, cls, idx: {"ttft_ms": per_cell[cell] + extra + idx % 7}

    before = build(plan, behaviour(0.0))
    after = build(plan, behaviour(shift))
    for cell, verdict in after["checks"]["acceptance"]["cells"].items():
        assert before["checks"]["acceptance"]["cells"][cell]["passed"] or not verdict["passed"]
    if before["decision"]["outcome"] == "isolate":
        assert after["decision"]["outcome"] == "isolate"
