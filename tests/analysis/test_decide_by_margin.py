"""A search experiment's verdict ranks its confirmed cells by the search's objective (#36): among
the cells the verdict allows, the widest worst-class margin to the contract on the confirmation
data wins, not the largest goodput gain, and a cell whose margin is not above B0's is not proposed.
decide.decide called directly on minimal comparisons; objective.pick_confirmed says the same."""

from __future__ import annotations

from typing import Any

from apps.analysis.decide import B0_KEY, confirmed_margins, decide
from apps.search.objective import pick_confirmed

CLASSES: list[Any] = [
    {"name": "short", "ttft_p99_ms": 500.0, "e2e_p99_ms": 9e9, "max_stall_ms": 9e9, "error_rate": 0.05},
    {"name": "long", "ttft_p99_ms": 9e9, "e2e_p99_ms": 20_000.0, "max_stall_ms": 9e9, "error_rate": 0.05},
]
B0 = {"short": 400.0, "long": 16_000.0}  # margins 0.2 and 0.2


def metric(candidate: float, b0: float, direction: str) -> dict[str, Any]:
    return {
        "candidate": candidate,
        "b0": b0,
        "direction": direction,
        "noninferior": True,
        "candidate_censored": False,
    }


def comparisons(cell: str, *, short: float, long: float, goodput: float) -> list[Any]:
    out = []
    for cls, value, primary in (("short", short, "ttft_p99_ms"), ("long", long, "e2e_p99_ms")):
        b0 = B0[cls]
        m = {
            "goodput_rps": metric(goodput, 10.0, "better" if goodput > 10.0 else "same"),
            "ttft_p99_ms": metric(
                value if primary == "ttft_p99_ms" else 1.0, b0 if primary == "ttft_p99_ms" else 1.0, "same"
            ),
            "e2e_p99_ms": metric(
                value if primary == "e2e_p99_ms" else 1.0, b0 if primary == "e2e_p99_ms" else 1.0, "same"
            ),
            "max_stall_p99_ms": metric(1.0, 1.0, "same"),
        }
        m[primary]["direction"] = "better" if value < b0 * 0.95 else "same"
        out.append(
            {
                "cell": cell,
                "mixture": "m",
                "rate": "r",
                "class": cls,
                "requests": [100, 100],
                "level": "p99",
                "metrics": m,
                "primary": primary,
                "repairs": [],
            }
        )
    return out


def verdict(by_margin: bool) -> Any:
    comps = [
        # C1: the largest goodput gain, its long class barely better (margin 0.22).
        *comparisons("C1", short=300.0, long=15_600.0, goodput=13.0),
        # C2: a smaller gain, both classes well clear (margin 0.35).
        *comparisons("C2", short=320.0, long=13_000.0, goodput=11.0),
        # C3: a gain on the short class while the long one has less to spare than under B0 (0.15).
        *comparisons("C3", short=250.0, long=17_000.0, goodput=12.0),
    ]
    cells: list[Any] = [{"cell_id": c} for c in ("B0", "C1", "C2", "C3")]
    accept = {c: {"passed": True, "failures": [], "checked": 2} for c in ("B0", "C1", "C2", "C3")}
    return (
        decide(
            cells=cells,
            baseline="B0",
            validity={"status": "pass", "rule": "", "invalid_cells": [], "problems": []},  # type: ignore[typeddict-item]
            acceptance={"status": "pass", "rule": "", "cells": accept, "agreed": [["m", "r", 1]]},  # type: ignore[typeddict-item]
            comparisons=comps,
            agreed=[("m", "r", 1)],
            classes=CLASSES,
            by_margin=by_margin,
        ),
        comps,
    )


def test_a_grid_ranks_by_goodput_gain_and_a_search_by_its_margin() -> None:
    grid, _ = verdict(by_margin=False)
    assert grid["outcome"] == "retune" and grid["chosen_cell"] == "C1"
    search, comps = verdict(by_margin=True)
    assert search["outcome"] == "retune" and search["chosen_cell"] == "C2"
    c3 = next(c for c in search["evidence"]["candidates"] if c["cell"] == "C3")
    assert not c3["eligible"] and "not above B0's 0.200" in c3["reasons"][-1]
    margins = confirmed_margins(comps, CLASSES, {("m", "r")})
    assert round(margins["C2"], 3) == 0.35 and round(margins[B0_KEY], 3) == 0.2
    assert pick_confirmed(["C1", "C2", "C3"], margins, baseline=margins[B0_KEY]) == "C2"


def test_the_report_of_a_search_experiment_ranks_by_margin() -> None:
    # Through the real build_report: the experiment says it is a search, and every candidate the
    # decision weighed carries its confirmed margin (a grid's do not).
    from apps.analysis.columns import RecordTable
    from apps.analysis.report import build_report
    from tests.analysis.builders import Plan, build_inputs
    from tests.analysis.test_decision_table import slow_short_b0

    def report(search: bool) -> Any:
        inputs = build_inputs(Plan(), slow_short_b0)
        records = inputs.pop("records")
        inputs["experiment"]["search"] = search
        return build_report(**inputs, table=RecordTable.from_records(records))

    searched = report(True)["decision"]
    assert searched["outcome"] == "retune" and searched["chosen_cell"] == "C1"
    assert all("confirmed_margin" in c for c in searched["evidence"]["candidates"])
    assert not any("confirmed_margin" in c for c in report(False)["decision"]["evidence"]["candidates"])
