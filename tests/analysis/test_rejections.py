"""The decision table's rejecting rows are gates the decision reads (apps/analysis/rejections.py):
"preemptions rise with the sequence limit" and "new short requests wait". Table-driven, on the
synthetic experiments of tests/analysis/builders.py (120 requests per run)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from apps.analysis.report import ReportOptions
from tests.analysis.builders import Plan, build, gauges
from tests.analysis.test_decision_table import short_waits, slow_short_b0


def preempting(per_run: dict[str, float]):  # type: ignore[no-untyped-def]
    def samples(run: dict[str, Any]) -> list[dict[str, Any]]:
        return gauges(run, preemptions=per_run.get(run["cell"], 0.0))

    return samples


def rejected_by(report: dict[str, Any]) -> dict[str, set[str]]:
    return {
        c["cell"]: {r["id"] for r in c["rejected_by"]}
        for c in report["decision"]["evidence"]["candidates"]
        if c["rejected_by"]
    }


# id, preemptions per run by cell (120 requests per run), options, outcome, chosen cell, rejections
PREEMPTION_CASES = [
    # Without the gate C1 wins (its short TTFT is the lowest): 5 per run is 4.2% of its requests.
    ("the winner preempts", {"C1": 5.0}, None, "retune", "C2", {"C1": {"preemptions"}}),
    # One per run is 0.8%, under the 1% default: no rejection.
    ("under the threshold", {"C1": 1.0}, None, "retune", "C1", {}),
    (
        "every candidate preempts",
        {"C1": 5.0, "C2": 3.0},
        None,
        "retain",
        "B0",
        {"C1": {"preemptions"}, "C2": {"preemptions"}},
    ),
    # B0 preempting is B0's business: the gate judges candidates.
    ("b0 preempts", {"B0": 50.0}, None, "retune", "C1", {}),
    # A team that accepts 5% sets it.
    ("threshold set in the spec", {"C1": 5.0}, {"max_preemption_share": 0.05}, "retune", "C1", {}),
]


@pytest.mark.parametrize(
    ("per_run", "options", "outcome", "chosen", "rejections"),
    [c[1:] for c in PREEMPTION_CASES],
    ids=[c[0] for c in PREEMPTION_CASES],
)
def test_a_candidate_that_fits_memory_only_by_preempting_is_rejected(
    per_run, options, outcome, chosen, rejections
) -> None:  # type: ignore[no-untyped-def]
    report = build(Plan(), slow_short_b0, samples=preempting(per_run), options=options)
    assert (report["decision"]["outcome"], report["decision"]["chosen_cell"]) == (outcome, chosen), report[
        "decision"
    ]
    assert rejected_by(report) == rejections
    for cell in rejections:
        entry = next(c for c in report["decision"]["evidence"]["candidates"] if c["cell"] == cell)
        assert not entry["eligible"]
        assert any(r.startswith("fits memory only by preempting") for r in entry["reasons"])
        row = entry["rejected_by"][0]
        assert row["preemptions_per_run"] == per_run[cell] and row["runs"] == 3


def test_short_requests_that_wait_reject_a_candidate_that_only_lowered_the_budget() -> None:
    # Every cell's short TTFT is 800 ms against 500 ms, with healthy streams: B0 breaks it too.
    report = build(Plan(), short_waits)
    assert rejected_by(report) == {"C1": {"short_requests_wait"}, "C2": {"short_requests_wait"}}
    c1 = next(c for c in report["decision"]["evidence"]["candidates"] if c["cell"] == "C1")
    reason = next(r for r in c1["reasons"] if r.startswith("new short requests wait"))
    assert "2048 < 8192" in reason and "a lower budget alone is not fairness" in reason
    # A candidate that raised the budget is not what this row is about (it still breaks the contract).
    raised = replace(
        Plan(),
        cells=[
            Plan().cells[0],
            {**Plan().cells[1], "args": {"max_num_batched_tokens": 16384, "max_num_seqs": 16}},
        ],
    )
    report = build(raised, short_waits)
    assert rejected_by(report) == {}
    c1 = next(c for c in report["decision"]["evidence"]["candidates"] if c["cell"] == "C1")
    assert "breaks a contract" in c1["reasons"]


def test_short_requests_that_wait_do_not_reject_a_candidate_that_keeps_the_short_contract() -> None:
    report = build(Plan(), slow_short_b0)
    assert rejected_by(report) == {}
    assert report["decision"]["chosen_cell"] == "C1"


@pytest.mark.parametrize("value", [-0.1, 1.5, "a lot", True])
def test_the_preemption_threshold_is_a_share(value) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="max_preemption_share"):
        ReportOptions.from_mapping({"max_preemption_share": value})
