"""The drift between runs the gate allowed for, and the gate under whole runs that differ (issue #32).

Pure: no database. The synthetic sets go through the real build_report and gate verdict;
bench/results/gate_power.md measures the rates these single sets stand for.
"""

from __future__ import annotations

import copy
import math
import xml.etree.ElementTree as ET
from typing import Any

import numpy as np
import pytest

from apps.analysis import inference
from apps.analysis.report import build_report
from apps.gate.verdict import gate_verdict
from clients import tailtune_gate as client
from tests.analysis.synthetic import Design, result_set
from tests.gate.test_verdict import report, with_metric

# Student's t, one-sided 5%, 2 degrees of freedom (two repeats a side): 2.919986.
T95_DF2 = 2.919986


def _case(v: dict[str, Any], cls: str, metric: str) -> dict[str, Any]:
    return next(c for c in v["cases"] if (c["class"], c["metric"]) == (cls, metric))


def _with_repeats(r: dict, cls: str, metric: str, b0: list[float], cand: list[float], **extra: Any) -> dict:
    r = copy.deepcopy(r)
    for c in r["comparisons"]:
        if c["class"] == cls:
            c["metrics"][metric].update(b0_repeats=b0, candidate_repeats=cand, **extra)
    return r


def test_each_case_shows_the_spread_between_runs_it_allowed_for() -> None:
    r = _with_repeats(report(), "long", "e2e_p99_ms", [880.0, 920.0], [890.0, 915.0], repeats_sd_rel=0.18)
    case = _case(gate_verdict(r), "long", "e2e_p99_ms")
    # The repeats' test rejects at 5% only past t(0.95, 2) x sd x sqrt(1/2 + 1/2) on the log scale.
    bar = math.expm1(T95_DF2 * math.log(1.18))
    assert (case["repeats_sd_rel"], case["repeats"], case["stand_out_alpha"]) == (0.18, [2, 2], 0.05)
    assert case["stand_out_rel"] == pytest.approx(bar, abs=1e-4) and round(bar, 2) == 0.62
    assert case["message"] == (
        "runs spread by 18% between repeats (2 of B0, 2 of the candidate): a regression must stand "
        "out from that, and one of about +62% or less cannot (the repeats' one-sided test at 0.05, "
        "before Holm)"
    )
    # Goodput is higher-is-better: the bar is a drop.
    r = _with_repeats(report(), "short", "goodput_rps", [2.0, 2.1], [2.0, 2.05], repeats_sd_rel=0.18)
    case = _case(gate_verdict(r), "short", "goodput_rps")
    assert case["stand_out_rel"] == pytest.approx(-math.expm1(-T95_DF2 * math.log(1.18)), abs=1e-4)
    assert "one of about -38% or less cannot" in case["message"], case["message"]


def test_a_failing_case_says_both_why_it_failed_and_what_drift_it_stood_out_from() -> None:
    r = with_metric(report(), "short", "ttft_p99_ms", b0=100, cand=400, p_worse=0.0005)
    r = _with_repeats(r, "short", "ttft_p99_ms", [95.0, 105.0], [390.0, 410.0], repeats_sd_rel=0.05)
    v = gate_verdict(r)
    case = _case(v, "short", "ttft_p99_ms")
    assert case["outcome"] == "fail"
    assert case["message"].startswith("materially worse than B0 at window/window")
    assert "; runs spread by 5% between repeats (2 of B0, 2 of the candidate)" in case["message"]


def test_a_report_from_before_the_field_takes_the_spread_from_its_repeats() -> None:
    b0, cand = [800.0, 1000.0], [900.0, 1100.0]
    r = _with_repeats(report(), "long", "e2e_p99_ms", b0, cand)
    case = _case(gate_verdict(r), "long", "e2e_p99_ms")
    logs_b, logs_c = np.log(b0), np.log(cand)
    pooled = math.sqrt((((logs_b - logs_b.mean()) ** 2).sum() + ((logs_c - logs_c.mean()) ** 2).sum()) / 2)
    assert inference.repeats_pooled_sd(cand, b0) == pytest.approx(pooled)
    assert case["repeats_sd_rel"] == pytest.approx(math.expm1(pooled), abs=1e-4)
    assert "runs spread by 16% between repeats" in case["message"], case["message"]
    # A report with no repeats at all (older still) shows no drift and keeps its verdict.
    v = gate_verdict(report())
    assert v["verdict"] == "pass"
    assert all("repeats_sd_rel" not in c for c in v["cases"])
    assert _case(v, "long", "e2e_p99_ms")["message"] is None


def test_no_drift_where_the_repeats_give_no_spread() -> None:
    assert inference.repeats_pooled_sd([900.0], [880.0, 920.0]) is None  # one repeat a side
    assert inference.repeats_pooled_sd([900.0, math.inf], [880.0, 920.0]) is None  # censored
    assert inference.repeats_pooled_sd([0.0, 1.0], [1.0, 1.0]) is None  # not positive: no log scale
    r = _with_repeats(report(), "long", "e2e_p99_ms", [880.0, 920.0], [900.0, None], repeats_sd_rel=None)
    case = _case(gate_verdict(r), "long", "e2e_p99_ms")
    assert "repeats_sd_rel" not in case and case["message"] is None
    # Identical repeats: said plainly, not as a 0% bar.
    r = _with_repeats(report(), "long", "e2e_p99_ms", [900.0, 900.0], [900.0, 900.0], repeats_sd_rel=0.0)
    assert _case(gate_verdict(r), "long", "e2e_p99_ms")["message"] == (
        "runs did not differ between repeats (2 of B0, 2 of the candidate)"
    )


def test_the_reports_show_the_drift() -> None:
    r = _with_repeats(report(), "long", "e2e_p99_ms", [880.0, 920.0], [890.0, 915.0], repeats_sd_rel=0.18)
    r = _with_repeats(r, "short", "e2e_p99_ms", [880.0, 920.0], [890.0, 915.0], repeats_sd_rel=0.07)
    v = {**gate_verdict(r), "url": "https://tailtune.example/experiments/7/", "experiment": 7}
    widest = (
        "drift allowed for: runs spread by up to 18% between repeats (long e2e_p99_ms, 2 runs of B0 and "
        "2 of the candidate); a regression had to stand out from that"
    )
    assert client.drift_line(v) == widest
    md = client.render_markdown(v)
    assert "Drift allowed for: runs spread by up to 18%" in md
    assert "runs spread by 7% between repeats" in md  # the short class's own, in its row
    junit = ET.fromstring(client.render_junit(v))
    props = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert props["drift"] == widest
    out = next(
        c for c in junit.iter("testcase") if (c.get("classname"), c.get("name")) == ("long", "e2e_p99_ms")
    )
    assert "runs spread by 18% between repeats" in (out.findtext("system-out") or "")
    said: list[str] = []

    class Opts:
        junit = markdown = json = None

    assert client.finish(v, Opts(), said.append) == 0  # type: ignore[arg-type]
    assert said[1] == f"  {widest}"
    # Nothing judged with a spread: no line.
    assert client.drift_line(gate_verdict(report())) is None


def _gate(design: Design, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    rep = build_report(**result_set(design, seed), token_hists={}, chunk_hists={}, options=None)
    return rep, dict(gate_verdict(rep, candidate="C1"))


def _bootstrap_only(rep: dict[str, Any]) -> dict[str, Any]:
    """The rule before the repeats' test (bench/analysis/gate_power.py's first column)."""
    rep = copy.deepcopy(rep)
    for c in rep["comparisons"]:
        for v in c["metrics"].values():
            v.pop("p_worse_repeats", None)
    return rep


GATE = {"cells": 2, "repeats": 2, "requests": 240}


@pytest.mark.parametrize(
    ("seed", "design"),
    [
        (18, Design(**GATE, host_sigma=0.25)),
        (16, Design(**GATE, host_sigma=0.25, round_sigma=0.25)),
    ],
    ids=["run sigma 0.25", "round sigma 0.25 and run sigma 0.25"],
)
def test_an_unchanged_candidate_whose_runs_drift_passes(seed: int, design: Design) -> None:
    rep, v = _gate(design, seed)
    # The bootstrap alone, which draws requests within runs, calls this drift a regression ...
    assert gate_verdict(_bootstrap_only(rep), candidate="C1")["exit_code"] == 1
    # ... the gate weighs it against the spread between repeats, passes, and says what it allowed for.
    assert v["verdict"] == "pass" and v["exit_code"] == 0, [c["message"] for c in v["cases"]]
    judged = [c for c in v["cases"] if c["outcome"] == "pass" and c.get("repeats_sd_rel")]
    assert judged and all(c["repeats"] == [2, 2] for c in judged)
    assert all(c["message"].startswith("runs spread by ") for c in judged)
    assert client.drift_line(v) is not None


def test_a_real_regression_still_fails_and_names_its_class() -> None:
    _, v = _gate(Design(**GATE, host_sigma=0.1, long_factor={"C1": 3.0}), 0)
    assert v["verdict"] == "regression" and v["exit_code"] == 1
    failed = {(c["class"], c["metric"]) for c in v["cases"] if c["outcome"] == "fail"}
    assert ("long", "e2e_p95_ms") in failed and all(cls == "long" for cls, _ in failed), failed
    case = _case(v, "long", "e2e_p95_ms")
    assert case["message"].startswith("materially worse than B0")
    assert "runs spread by" in case["message"] and case["candidate"] > 2 * case["b0"]
