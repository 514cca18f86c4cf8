"""Overload is named, not advised on (apps/analysis/overload.py, docs/ANALYSIS.md "Overload"):
when arrivals outrun completions through the window for B0 itself, the report says so, the
decision gives no retain/retune/isolate advice at that rate, and the findings keep the signal
queueing does not drive. Table-driven, on the synthetic experiments of tests/analysis/builders.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from apps.analysis.columns import RecordTable
from apps.analysis.metrics import run_window
from apps.analysis.overload import run_load
from apps.analysis.report import build_report
from tests.analysis.builders import Plan, build_inputs, request

PLAN = Plan()  # 120 requests in a 10 s window per run, after a 1 s warm-up
STEP_MS = PLAN.observation_s * 1000 / (2 * PLAN.per_class)


def served_at(slowdown: float) -> Callable[[int], float]:
    """TTFT of the idx-th request when the server serves ``slowdown`` times slower than requests
    arrive (1.6: arrivals outrun completions by 60%; 1.0: it keeps up)."""
    return lambda idx: 50.0 + (idx - 2) * STEP_MS * (slowdown - 1.0)


def behaviour_of(slowdown: Mapping[str, float], stall: Mapping[str, float] | None = None):  # type: ignore[no-untyped-def]
    def behaviour(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        kw: dict[str, Any] = {"ttft_ms": served_at(slowdown.get(cell, 1.0))(idx)}
        if stall and cls == "short" and idx % 10 == 2:
            kw["stall_ms"] = stall[cell]
        return kw

    return behaviour


def waiting_gauge(per_cell: Mapping[str, float]):  # type: ignore[no-untyped-def]
    """The scraped waiting gauge of each run: rising by ``per_cell[cell]`` requests per second
    from the window's start, every half second."""

    def samples(run: dict[str, Any]) -> list[dict[str, Any]]:
        rise = per_cell.get(run["cell"], 0.0)
        return [
            {
                "t_ns": int(t * 1e9),
                "phase": "during",
                "epoch": 0,
                "name": "vllm:num_requests_waiting",
                "labels": {},
                "kind": "gauge",
                "value": max(0.0, rise * (t - PLAN.warmup_s)),
                "histogram": None,
            }
            for t in np.arange(0.0, PLAN.warmup_s + PLAN.observation_s + 0.01, 0.5)
        ]

    return samples


def report_of(
    behaviour: Any,
    *,
    plan: Plan = PLAN,
    samples: Any = None,
    experiment: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    inputs = build_inputs(plan, behaviour, samples=samples)
    records = inputs.pop("records")
    inputs["experiment"] = {**inputs["experiment"], **(experiment or {})}
    return build_report(**inputs, table=RecordTable.from_records(records), options=options)


# id, B0's and the candidates' slowdown, waiting gauge rise (req/s), extra experiment keys,
# whether B0's point is overloaded, and what the rule must say
CASES = [
    ("keeps up", {}, {}, {}, False, None),
    (
        "queue grows through the window",
        {"B0": 1.6, "C1": 1.6, "C2": 1.6},
        {},
        {},
        True,
        ["no capacity of B0 was measured (rates typed by hand)", "give the spec a `calibration` block"],
    ),
    (
        "the waiting gauge rises",
        {},
        {"B0": 3.0},
        {},
        True,
        ["its waiting gauge +3.00 req/s"],
    ),
    ("the waiting gauge barely moves", {}, {"B0": 0.5}, {}, False, None),
    ("only a candidate falls behind", {"C1": 1.6}, {"C1": 3.0}, {}, False, None),
    (
        "against B0's measured capacity",
        {"B0": 1.6, "C1": 1.6, "C2": 1.6},
        {},
        {"rates_source": "probe", "capacities": {"mix": 2.5}},
        True,
        ["1.60x B0's measured capacity of 2.5 req/s", "lower calibration.fractions"],
    ),
]


@pytest.mark.parametrize(
    ("slowdown", "gauge", "experiment", "overloaded", "phrases"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_it_names_b0s_overload_and_gives_no_advice_at_that_rate(
    slowdown, gauge, experiment, overloaded, phrases
):
    report = report_of(
        behaviour_of(slowdown), samples=waiting_gauge(gauge) if gauge else None, experiment=experiment
    )
    (point,) = report["overload"]
    assert (point["mixture"], point["rate"], point["agreed"]) == ("mix", "r1", True)
    assert point["overloaded"] is overloaded, point
    decision = report["decision"]
    found = {f["id"]: f for f in report["findings"]}
    if not overloaded:
        assert "overload" not in decision["evidence"] and "b0_overloaded" not in found
        assert "overload" not in decision["rule"]
        return
    assert point["runs_overloaded"] == PLAN.repeats
    assert decision["outcome"] == "inconclusive"
    rule = decision["rule"]
    assert rule.startswith(
        "the experiment measured overload: B0 fell behind its arrivals at mix @ r1: 12.00 req/s arrived (4 req/s offered)"
    )
    assert "retain, retune or isolate advice does not apply at that rate" in rule
    for phrase in phrases:
        assert phrase in rule, (phrase, rule)
    advice = decision["evidence"]["advice_not_applicable"]
    assert f"it would have said {advice['outcome']} {advice['chosen_cell']}" in rule
    assert decision["evidence"]["overload"] == [point]
    assert found["b0_overloaded"]["evidence"][0]["queue_growth_rps"] == point["queue_growth_rps"]


def test_it_measures_the_queue_growth_from_the_client_records():
    report = report_of(behaviour_of({"B0": 1.6, "C1": 1.6, "C2": 1.6}))
    (point,) = report["overload"]
    # 120 requests planned in the 10 s window; served 1.6 times slower, about 120 / 1.6 of them
    # (and the warm-up's) end inside it: the queue grows by the rest.
    assert point["arrivals_rps"] == pytest.approx(12.0)
    assert point["completions_rps"] == pytest.approx(12.0 / 1.6, abs=0.25)
    assert point["queue_growth_rps"] == pytest.approx(
        point["arrivals_rps"] - point["completions_rps"], abs=0.11
    )
    assert point["capacity_rps"] is None and point["offered_over_capacity"] is None


def test_an_overloaded_rate_that_is_not_agreed_is_reported_and_leaves_the_decision_alone():
    plan = replace(PLAN, rates={"low": 2.0, "high": 6.0})

    def behaviour(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        return {"ttft_ms": served_at(1.6 if rate == "high" else 1.0)(idx)}

    report = report_of(behaviour, plan=plan, options={"agreed_rates": ["low"]})
    by_rate = {p["rate"]: p for p in report["overload"]}
    assert by_rate["high"]["overloaded"] and not by_rate["high"]["agreed"]
    assert not by_rate["low"]["overloaded"]
    assert report["decision"]["outcome"] == "retain"
    assert "b0_overloaded" in {f["id"] for f in report["findings"]}


def test_the_findings_keep_the_signal_under_the_queue():
    # B0 overloaded; its short streams stall 3,138 ms, C1's 275 ms (issue #35 item 6's run).
    report = report_of(
        behaviour_of({"B0": 1.6, "C1": 1.6, "C2": 1.6}, stall={"B0": 3138.0, "C1": 275.0, "C2": 3138.0})
    )
    finding = next(f for f in report["findings"] if f["id"] == "b0_overloaded")
    rows = {(e["cell"], e["class"]): e for e in finding["evidence"] if "class" in e}
    c1 = rows[("C1", "short")]
    assert c1["max_stall_p99"]["ms"] == pytest.approx(275.0)
    assert c1["b0_max_stall_p99"]["ms"] == pytest.approx(3138.0)
    # C1 breaks its TTFT contract under the overload too, so it is never "better"; the paired
    # interval still shows the stall difference, every end of it below zero.
    stall = c1["compared"]["max_stall_p95_ms"]
    assert stall["diff"] == pytest.approx(275.0 - 3138.0)
    assert stall["ci"][1] < 0
    assert rows[("B0", "short")]["max_stall_p99"]["ms"] == pytest.approx(3138.0)


def _load(ttfts: list[float], window_s: float = 9.0) -> Any:
    """run_load over one run of evenly planned requests (one per 100 ms from 0) with these TTFTs."""
    records = [request("r", i, "short", int(i * 1e8), ttft_ms=t, tokens=1) for i, t in enumerate(ttfts)]
    table = RecordTable.from_records(records)
    window = run_window({"warmup_s": 0.0, "observation_s": window_s, "drain_deadline_s": 60.0})
    return run_load("r", table, np.arange(len(records)), window)


# id, TTFT of each of 100 requests (ms), overloaded
RUNS = [
    ("steady", [300.0] * 100, False),
    ("growing", [50.0 + 60.0 * i for i in range(100)], True),
    # A burst that builds a queue and drains it inside the window is not overload.
    ("burst then drain", [50.0 + (1500.0 - 50.0 * abs(i - 30) if 10 <= i < 50 else 0.0) for i in range(100)], False),
    # Slow from the start but not falling further behind: a long wait, not a growing queue.
    ("slow but stable", [3000.0] * 100, False),
]  # fmt: skip


@pytest.mark.parametrize(("ttfts", "overloaded"), [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_a_run_is_overloaded_only_when_its_queue_grows_through_the_window(ttfts, overloaded):
    load = _load(ttfts)
    assert load.overloaded is overloaded, load
