"""The gate's verdict from a report, table-driven (pure: no database)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from apps.gate.verdict import gate_verdict


def metric(
    *, b0: float, cand: float, p_worse: float = 0.5, judged: bool = True, threshold: float = 10.0
) -> dict:
    return {
        "b0": b0,
        "candidate": cand,
        "diff": cand - b0,
        "harm": cand - b0,
        "ci": [cand - b0 - 5, cand - b0 + 5],
        "threshold": threshold,
        "p_worse": p_worse,
        "judged": judged,
        "note": None if judged else "not enough requests to judge",
        "candidate_censored": False,
        "b0_censored": False,
        "direction": "same",
    }


def report(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "baseline": "B0",
        "cells": [{"cell_id": "B0"}, {"cell_id": "C1"}],
        "classes": [{"name": "short"}, {"name": "long"}],
        "options": {"compare": {"confidence": 0.95, "family_alpha": 0.05}},
        "checks": {
            "validity": {"problems": [], "invalid_cells": []},
            "acceptance": {
                "cells": {"B0": {"passed": True, "failures": []}, "C1": {"passed": True, "failures": []}}
            },
        },
        "decision": {"outcome": "retain", "rule": "..."},
        "comparisons": [
            {
                "cell": "C1",
                "mixture": "window",
                "rate": "window",
                "class": name,
                "metrics": {
                    "ttft_p99_ms": metric(b0=100, cand=101),
                    "e2e_p99_ms": metric(b0=900, cand=905),
                    "goodput_rps": metric(b0=2, cand=2, threshold=0.1),
                },
            }
            for name in ("short", "long")
        ],
    }
    base.update(over)
    return base


def with_metric(r: dict, cls: str, name: str, **kw: Any) -> dict:
    r = copy.deepcopy(r)
    for c in r["comparisons"]:
        if c["class"] == cls:
            c["metrics"][name] = metric(**kw)
    return r


def failure(cls: str, broken: list[str]) -> dict:
    return {"mixture": "window", "rate": "window", "class": cls, "broken": broken, "repeats": [1, 2]}


def with_failures(r: dict, cell: str, failures: list[dict]) -> dict:
    r = copy.deepcopy(r)
    r["checks"]["acceptance"]["cells"][cell] = {"passed": not failures, "failures": failures}
    return r


CASES = [
    ("unchanged", report(), "pass", []),
    (
        "a material, family-wise significant worse TTFT of one class",
        with_metric(report(), "short", "ttft_p99_ms", b0=100, cand=400, p_worse=0.0005),
        "regression",
        [("short", "ttft_p99_ms")],
    ),
    (
        "significant alone but not after Holm over the family (6 metrics: 0.02 > 0.05/6)",
        with_metric(report(), "short", "ttft_p99_ms", b0=100, cand=400, p_worse=0.02),
        "pass",
        [],
    ),
    (
        "significant but below the material threshold",
        with_metric(report(), "long", "e2e_p99_ms", b0=900, cand=905, p_worse=0.0005, threshold=50),
        "pass",
        [],
    ),
    (
        "a candidate that breaks a contract B0 keeps",
        with_failures(report(), "C1", [failure("long", ["e2e"])]),
        "regression",
        [("long", "e2e_p99_ms")],
    ),
    (
        "a contract both break is not the candidate's regression",
        with_failures(
            with_failures(report(), "C1", [failure("long", ["e2e"])]), "B0", [failure("long", ["e2e"])]
        ),
        "pass",
        [],
    ),
    (
        "the candidate's error rate over a limit B0 keeps",
        with_failures(report(), "C1", [failure("short", ["error_rate"])]),
        "regression",
        [("short", "error_rate")],
    ),
]


@pytest.mark.parametrize(("label", "rep", "expected", "failing"), CASES, ids=[c[0] for c in CASES])
def test_verdicts(label: str, rep: dict, expected: str, failing: list) -> None:
    v = gate_verdict(rep)
    assert v["verdict"] == expected, v
    assert v["exit_code"] == {"pass": 0, "regression": 1, "inconclusive": 2}[expected]
    assert [(c["class"], c["metric"]) for c in v["cases"] if c["outcome"] == "fail"] == failing
    # One case per class x metric, every class named.
    assert {c["class"] for c in v["cases"]} == {"short", "long"}


def test_invalid_runs_make_it_inconclusive_even_with_a_regression() -> None:
    r = with_metric(report(), "short", "ttft_p99_ms", b0=100, cand=400, p_worse=0.0005)
    r["checks"]["validity"]["problems"] = [
        {
            "cell": "C1",
            "problem": "dispatch lag p99 above tolerance",
            "mixture": "window",
            "rate": "window",
            "repeat": 1,
        }
    ]
    v = gate_verdict(r)
    assert v["verdict"] == "inconclusive" and v["exit_code"] == 2
    assert v["reasons"] == ["C1 window/window/1: dispatch lag p99 above tolerance"]


def test_the_tuning_decisions_own_inconclusive_is_not_the_gates() -> None:
    r = with_failures(report(), "B0", [failure("long", ["e2e"])])
    r["decision"] = {
        "outcome": "inconclusive",
        "rule": "B0 breaks a contract; the candidates that keep every contract are materially worse "
        "than B0 on some class: a person must weigh it",
    }
    v = gate_verdict(r)
    assert v["verdict"] == "pass" and v["reasons"] == [], v


def test_b0_failing_is_inconclusive() -> None:
    r = report(decision={"outcome": "inconclusive", "rule": "B0 has invalid or missing runs"})
    r["checks"]["validity"]["problems"] = [
        {
            "cell": "B0",
            "problem": "missing",
            "mixture": "window",
            "rate": "window",
            "repeat": 2,
            "statuses": ["failed"],
        }
    ]
    assert gate_verdict(r)["verdict"] == "inconclusive"


def test_a_class_too_small_to_judge_is_inconclusive_unless_another_class_regressed() -> None:
    r = report()
    for c in r["comparisons"]:
        if c["class"] == "long":
            for m in c["metrics"].values():
                m["judged"] = False
    v = gate_verdict(r)
    assert v["verdict"] == "inconclusive" and "class long" in v["reasons"][0]
    assert {c["outcome"] for c in v["cases"] if c["class"] == "long" and c["metric"].endswith("_ms")} == {
        "skipped"
    }
    worse = with_metric(r, "short", "ttft_p99_ms", b0=100, cand=400, p_worse=0.0005)
    assert gate_verdict(worse)["verdict"] == "regression"


def test_running_cancelled_and_several_candidates() -> None:
    assert gate_verdict(None, status="running")["verdict"] == "running"
    v = gate_verdict(None, status="cancelled", status_reason="cancelled by ci")
    assert v["verdict"] == "inconclusive" and "cancelled by ci" in v["reasons"][0]
    r = report(cells=[{"cell_id": "B0"}, {"cell_id": "C1"}, {"cell_id": "C2"}])
    with pytest.raises(ValueError, match="name the candidate"):
        gate_verdict(r)
    assert gate_verdict(r, candidate="C1")["verdict"] == "pass"
    with pytest.raises(ValueError, match="no candidate 'C9'"):
        gate_verdict(r, candidate="C9")


def test_an_unanswered_candidate_is_infinitely_worse() -> None:
    r = with_metric(report(), "long", "e2e_p99_ms", b0=900, cand=900, p_worse=0.0005)
    m = r["comparisons"][1]["metrics"]["e2e_p99_ms"]
    m.update(harm=None, candidate=None, candidate_censored=True, candidate_above=4200.0)
    assert gate_verdict(r)["verdict"] == "regression"


def test_a_censored_tail_says_how_far_it_is_known_and_how_many_requests_went_unanswered() -> None:
    from clients.tailtune_gate import case_line, render_markdown

    r = with_metric(report(), "long", "e2e_p99_ms", b0=900, cand=900, p_worse=0.0005)
    r["comparisons"][1]["metrics"]["e2e_p99_ms"].update(
        harm=None, candidate=None, candidate_censored=True, candidate_above=4200.0
    )

    def run(cell: str, repeat: int, unfinished: int, errors: int = 0, status: str = "done") -> dict:
        counts = {"offered": 110, "unfinished": unfinished, "errors": errors, "unsent": 0}
        return {"cell": cell, "repeat": repeat, "status": status, "classes": {"long": {"counts": counts}}}

    # Two done runs of the candidate count; an invalid one, and B0's, do not.
    r["runs"] = [
        run("C1", 1, 30, errors=2),
        run("C1", 2, 7),
        run("C1", 3, 99, status="invalid"),
        run("B0", 1, 0),
    ]
    v = gate_verdict(r)
    case = next(c for c in v["cases"] if c["class"] == "long" and c["metric"] == "e2e_p99_ms")
    assert case["candidate_above"] == 4200.0
    assert case["candidate_unanswered"] == {"offered": 220, "unfinished": 37, "failed": 2}
    assert "b0_unanswered" not in case
    line = case_line(case)
    assert "B0 900 ms" in line
    assert (
        "candidate above 4200 ms (censored: 37 of 220 requests unfinished at the drain deadline, 2 failed)"
        in line
    )
    assert "| 900 ms | above 4200 ms (censored: 37 of 220 requests" in render_markdown({**v, "url": ""})


def test_the_gate_file_shown_in_the_docs_is_accepted() -> None:
    import re
    from pathlib import Path

    from apps.gate.build import GateInput, resolve_baseline, split_of

    doc = (Path(__file__).resolve().parents[2] / "docs" / "GATE.md").read_text()
    example = re.findall(r"```yaml\n(.*?)```", doc, re.S)[0]
    request = GateInput(trace_format="azure", spec_text=example)
    base = resolve_baseline(request)
    assert base.args == {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
    assert split_of(request, base) == "short:1024,long"
    assert base.workload["max_dispatch_lag_ms"] == 50


def test_a_candidate_that_breaks_its_quality_contract_is_a_regression() -> None:
    r = report()
    r["checks"]["acceptance"]["cells"]["C1"] = {
        "passed": False,
        "failures": [{"mixture": "quality probe", "rate": "", "class": "short", "broken": ["quality"]}],
    }
    v = gate_verdict(r)
    assert v["verdict"] == "regression" and v["exit_code"] == 1
    case = next(c for c in v["cases"] if c["metric"] == "quality")
    assert case["class"] == "short" and case["outcome"] == "fail" and "quality contract" in case["message"]


def test_a_validator_past_its_time_budget_is_named_in_the_gates_case() -> None:
    r = report()
    failure = {
        "mixture": "quality probe", "rate": "", "class": "short", "broken": ["quality"],
        "quality": {
            "broken": ["validator json_schema"],
            "validator_failures": {"json_schema": {"ran past its time budget (1 s an answer)": 3}},
        },
    }  # fmt: skip
    r["checks"]["acceptance"]["cells"]["C1"] = {"passed": False, "failures": [failure]}
    case = next(c for c in gate_verdict(r)["cases"] if c["metric"] == "quality")
    assert case["outcome"] == "fail"
    assert "validator json_schema: 3 × ran past its time budget (1 s an answer)" in case["message"], case


def test_an_error_rate_case_shows_each_sides_pooled_rate() -> None:
    from clients.tailtune_gate import case_line

    r = with_failures(report(), "C1", [failure("short", ["error_rate"])])

    def run(cell: str, failed: int, judged: int, status: str = "done") -> dict:
        over_limit = {"ttft": [0, judged], "error_rate": [failed, judged]}
        return {"cell": cell, "status": status, "classes": {"short": {"over_limit": over_limit}}}

    # Pooled over done runs as acceptance pools them: 14 of 200 for C1, 0 for B0.
    r["runs"] = [run("C1", 10, 100), run("C1", 4, 100), run("C1", 50, 50, status="invalid")]
    r["runs"] += [run("B0", 0, 100), run("B0", 0, 100)]
    case = next(c for c in gate_verdict(r)["cases"] if (c["class"], c["metric"]) == ("short", "error_rate"))
    assert case["outcome"] == "fail"
    assert (case["b0"], case["candidate"]) == (0.0, 0.07)
    assert "B0 0, candidate 0.07" in case_line(case), case_line(case)
