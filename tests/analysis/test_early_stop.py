"""Early stopping (apps/analysis/early_stop.py): a stopped sweep reaches the full sweep's decision.

Each test replays a synthetic sweep run by run, as the worker does: after each run ends,
the cells early_stop.doomed names lose their remaining sweep runs (status ``skipped``,
no records). The report of what is left must decide exactly as the report of every run.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.analysis import early_stop
from apps.analysis.columns import RecordTable
from apps.analysis.report import build_report
from tests.analysis.builders import Plan, build_inputs
from tests.analysis.test_decision_table import CASES, long_unfinished, stalls_everywhere


def report_of(inputs: Mapping[str, Any], records: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
    plain = {k: v for k, v in inputs.items() if k != "records"}
    return build_report(**plain, table=RecordTable.from_records(list(records)), **kwargs)


def cohort_bounds(full: Mapping[str, Any]) -> dict[tuple[str, str, int], dict[str, int]]:
    """Per point and class, the largest cohort any sweep run there had: every run at a point
    replays one trace, so this is the trace's count the service reads."""
    out: dict[tuple[str, str, int], dict[str, int]] = defaultdict(dict)
    for r in full["runs"]:
        if r["scenario"]:
            continue
        point = out[(r["mixture"], r["rate"], int(r["repeat"]))]
        for name, m in r["classes"].items():
            point[name] = max(point.get(name, 0), int(m["counts"]["offered"]))
    return dict(out)


def stopped_sweep(
    inputs: Mapping[str, Any], full: Mapping[str, Any], *, finish_order: Sequence[int] | None = None
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The inputs as an early-stopped sweep leaves them, and why each stopped cell stopped.

    Runs end in ``finish_order`` (indices into the plan's runs; default the plan order).
    """
    runs = list(inputs["runs"])
    over = {
        r["key"]: {name: m["over_limit"] for name, m in r["classes"].items() if "over_limit" in m}
        for r in full["runs"]
        if r["status"] == "done"
    }
    agreed = [tuple(a) for a in full["checks"]["acceptance"]["agreed"]]
    alpha = full["options"]["compare"]["contract_alpha"]
    bounds = cohort_bounds(full)
    status = {r["key"]: "queued" for r in runs}
    stopped: dict[str, dict[str, Any]] = {}
    finished: list[str] = []
    for i in finish_order if finish_order is not None else range(len(runs)):
        run = runs[i]
        if run["cell"] in stopped and not run["scenario"]:
            status[run["key"]] = "skipped"
            continue
        status[run["key"]] = run["status"]
        finished.append(run["key"])
        stopped.update(
            early_stop.doomed(
                cells=[run["cell"]],
                baseline=full["baseline"],
                runs=[{**r, "status": status[r["key"]]} for r in runs],
                over=over,
                agreed=agreed,
                classes=inputs["classes"],
                bounds=bounds,
                alpha=alpha,
                order=finished,
            )
        )
    left = []
    for r in runs:
        if status[r["key"]] == "skipped":
            left.append({**r, "status": "skipped", "reason": stopped[r["cell"]]["reason"]})
        else:
            left.append(r)
    records = [rec for rec in inputs["records"] if status[rec.run_id] != "skipped"]
    return {**inputs, "runs": left, "records": records}, stopped


def assert_same_decision(full: Mapping[str, Any], stopped: Mapping[str, Any]) -> None:
    a, b = full["decision"], stopped["decision"]
    assert (b["outcome"], b["chosen_cell"]) == (a["outcome"], a["chosen_cell"]), (a["rule"], b["rule"])
    if "seed_check" in a:
        assert (b["seed_check"]["outcome"], b["seed_check"]["chosen_cell"]) == (
            a["seed_check"]["outcome"],
            a["seed_check"]["chosen_cell"],
        )


def assert_same_evidence(full: Mapping[str, Any], stopped: Mapping[str, Any], why: Mapping[str, Any]) -> None:
    """Beyond the verdict: the gain family, the draws and every comparison of a cell that ran in
    full are the same, so no "better" rests on whether another cell was stopped."""
    for key in ("size", "gains"):
        assert stopped["statistics"]["family"][key] == full["statistics"]["family"][key], key
    assert stopped["statistics"]["resamples"] == full["statistics"]["resamples"]
    kept = [c for c in full["comparisons"] if c["cell"] not in why]
    assert [c for c in stopped["comparisons"] if c["cell"] not in why] == kept


def assert_sound(full: Mapping[str, Any], why: Mapping[str, Mapping[str, Any]]) -> None:
    """A cell called doomed never passes acceptance with every run in, nor is B0 ever stopped."""
    assert full["baseline"] not in why
    for cell in why:
        assert not full["checks"]["acceptance"]["cells"][cell]["passed"], cell


# Cells each decision-table case stops, and the class and contract key the reason names.
STOPS = {
    "isolate": {"C1": ("short", "stall"), "C2": ("short", "stall")},
    "short-wait": {"C1": ("short", "ttft"), "C2": ("short", "ttft")},
    "throughput": {"C2": ("short", "ttft")},
    "long-unfinished": {"C1": ("long", "ttft")},
    "stall-vs-short-only": {"C1": ("short", "stall"), "C2": ("short", "stall")},
}


@pytest.mark.parametrize(
    ("case", "plan", "behaviour", "kwargs"),
    [(c[0], *c[1:4]) for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_stopped_sweep_reaches_the_decision_of_the_full_sweep(case, plan, behaviour, kwargs):
    inputs = build_inputs(plan, behaviour, **kwargs)
    full = report_of(inputs, inputs["records"])
    left, why = stopped_sweep(inputs, full)
    assert_sound(full, why)
    assert {c: (w["class"], w["metric"]) for c, w in why.items()} == STOPS.get(case, {})
    stopped = report_of(left, left["records"])
    assert_same_decision(full, stopped)
    assert_same_evidence(full, stopped, why)
    skipped = [r for r in stopped["runs"] if r["status"] == "skipped"]
    assert bool(skipped) == bool(why)
    assert all(r["cell"] in why and r["cell"] != full["baseline"] for r in skipped)


def test_a_cell_is_stopped_by_the_run_that_settled_it_and_named_in_the_report():
    inputs = build_inputs(Plan(), long_unfinished)
    full = report_of(inputs, inputs["records"])
    left, why = stopped_sweep(inputs, full)
    # A fifth of C1's long requests never finish: its first run already breaks the contract
    # whatever its two other repeats show (12 of 60, with at most 120 more to come, against 1%).
    first_c1 = next(r for r in inputs["runs"] if r["cell"] == "C1")
    assert why["C1"]["run"] == first_c1["key"]
    assert why["C1"]["reason"] == f"cannot be accepted (run {first_c1['key']} broke long ttft)"
    assert why["C1"]["over"] == [12, 60] and why["C1"]["most_to_come"] == 120
    report = report_of(left, left["records"])
    skipped = [r for r in report["runs"] if r["status"] == "skipped"]
    assert [r["repeat"] for r in skipped] == [1, 2]
    assert {r["reason"] for r in skipped} == {why["C1"]["reason"]}
    # Reported as stopped, with what settled it: the run, its point, the class and contract key,
    # and that run's own count over the limit (12 of its 60 long requests never finished).
    assert report["skipped"] == [
        {
            "cell": "C1",
            "reason": why["C1"]["reason"],
            "runs": [r["key"] for r in skipped],
            "settled_by": {
                "run": first_c1["key"],
                "mixture": "mix",
                "rate": "r1",
                "repeat": 0,
                "class": "long",
                "metric": "ttft",
                "run_over": [12, 60],
            },
        }
    ]
    # Stopped is not invalid: validity is about comparability, and C1's runs are comparable.
    validity = report["checks"]["validity"]
    assert validity["status"] == "pass" and validity["invalid_cells"] == []
    assert [p for p in validity["problems"] if p["cell"] == "C1"] == []
    # Acceptance is where the stop shows: C1 can no longer keep its contracts.
    failures = report["checks"]["acceptance"]["cells"]["C1"]["failures"]
    assert failures[0]["broken"] == [f"skipped: {why['C1']['reason']}"]
    considered = {c["cell"]: c for c in report["decision"]["evidence"]["candidates"]}
    assert "invalid" not in considered["C1"]["reasons"] and "breaks a contract" in considered["C1"]["reasons"]
    assert report["decision"]["outcome"] == "retain"


def test_a_stopped_cell_with_a_real_comparability_problem_is_still_invalid():
    inputs = build_inputs(Plan(), long_unfinished)
    full = report_of(inputs, inputs["records"])
    left, why = stopped_sweep(inputs, full)
    first_c1 = why["C1"]["run"]
    # The run that settled C1 replayed another trace: that is a validity problem, stop or not.
    left["runs"] = [{**r, "trace_sha256": "another"} if r["key"] == first_c1 else r for r in left["runs"]]
    report = report_of(left, left["records"])
    validity = report["checks"]["validity"]
    assert validity["invalid_cells"] == ["C1"]
    assert {p["problem"] for p in validity["problems"] if p["cell"] == "C1"} == {
        "trace_sha256 differs from B0"
    }


def test_runs_skipped_for_another_reason_stay_a_validity_problem():
    # A gate stops at its first unusable run (engine.stop_on_invalid): the runs it skipped leave
    # their points without data, which is a comparability problem, not a contract settled.
    inputs = build_inputs(Plan(), long_unfinished)
    why = "the answer is inconclusive (run B0-mix-r1-0 invalid: server not idle)"
    left = [
        {**r, "status": "skipped", "reason": why} if (r["cell"] == "C1" and r["repeat"] == 2) else r
        for r in inputs["runs"]
    ]
    kept = [rec for rec in inputs["records"] if not rec.run_id.startswith("C1-mix-r1-2")]
    report = report_of({**inputs, "runs": left}, kept)
    validity = report["checks"]["validity"]
    assert validity["invalid_cells"] == ["C1"]
    assert [p["problem"] for p in validity["problems"] if p["cell"] == "C1"] == [f"skipped: {why}"]
    assert "settled_by" not in report["skipped"][0]


def test_nothing_is_stopped_while_the_remaining_runs_could_still_dilute_a_break():
    # Two of 60 short requests over the stall limit in every run: 2/60 alone breaks 1%, but
    # with up to 120 more requests to come, 2/180 does not; only the last repeat settles it.
    def two_stalls(cell, mix, rate, rep, cls, idx):
        return {"stall_ms": 400.0} if (cell == "C1" and cls == "short" and idx in (2, 4)) else {}

    inputs = build_inputs(Plan(), two_stalls)
    full = report_of(inputs, inputs["records"])
    _, why = stopped_sweep(inputs, full)
    assert not full["checks"]["acceptance"]["cells"]["C1"]["passed"]
    last_c1 = [r for r in inputs["runs"] if r["cell"] == "C1"][-1]
    assert why["C1"]["run"] == last_c1["key"] and why["C1"]["most_to_come"] == 0


def test_a_point_without_a_bound_or_with_the_baseline_is_never_doomed():
    inputs = build_inputs(Plan(), stalls_everywhere)
    full = report_of(inputs, inputs["records"])
    runs = [{**r, "status": "done" if r["repeat"] == 0 else "queued"} for r in inputs["runs"]]
    common = {
        "cells": ["B0", "C1", "C2"],
        "baseline": "B0",
        "runs": runs,
        "over": {r["key"]: {n: m["over_limit"] for n, m in r["classes"].items()} for r in full["runs"]},
        "agreed": [tuple(a) for a in full["checks"]["acceptance"]["agreed"]],
        "classes": inputs["classes"],
    }
    assert set(early_stop.doomed(**common, bounds=cohort_bounds(full))) == {"C1", "C2"}
    # Unknown traces for the repeats still to come: they could add any number of requests.
    assert early_stop.doomed(**common, bounds={}) == {}


def test_a_done_run_behind_a_run_that_may_still_finish_is_not_settled():
    # The report pools the first done run of a repeat in its order; a queued run before it
    # may still become that run, so the later one's counts settle nothing yet.
    inputs = build_inputs(replace(Plan(), repeats=1), long_unfinished)
    full = report_of(inputs, inputs["records"])
    c1 = next(r for r in inputs["runs"] if r["cell"] == "C1")
    twin = {**c1, "key": "C1-twin", "status": "queued"}
    common = {
        "cells": ["C1"],
        "baseline": "B0",
        "over": {c1["key"]: {n: m["over_limit"] for n, m in full["runs"][1]["classes"].items()}},
        "agreed": [tuple(a) for a in full["checks"]["acceptance"]["agreed"]],
        "classes": inputs["classes"],
        "bounds": cohort_bounds(full),
    }
    assert full["runs"][1]["key"] == c1["key"]
    assert set(early_stop.doomed(**common, runs=[c1, twin])) == {"C1"}
    assert early_stop.doomed(**common, runs=[twin, c1]) == {}
    assert set(early_stop.doomed(**common, runs=[{**twin, "status": "failed"}, c1])) == {"C1"}


def test_the_reason_names_the_run_the_class_and_the_contract_key():
    assert early_stop.reason("r-1", "long", "e2e") == "cannot be accepted (run r-1 broke long e2e)"
    # ... and reads back, so the report says what settled a stopped cell.
    assert early_stop.settled_by(early_stop.reason("r-1", "long chat", "error_rate")) == (
        "r-1",
        "long chat",
        "error_rate",
    )
    assert early_stop.settled_by("the answer is inconclusive (run r-1 invalid: lag)") is None
    assert early_stop.settled_by("") is None


# --- random result sets ---------------------------------------------------------------

SHARES = (0.01, 0.02, 0.03, 0.05, 0.15, 0.4)
TROUBLES = st.tuples(
    st.sampled_from(["short", "long"]), st.sampled_from(["slow", "stall", "error"]), st.sampled_from(SHARES)
)


@st.composite
def result_sets(draw: st.DrawFn) -> dict[str, Any]:
    candidates = draw(st.integers(1, 3))
    rates = draw(st.sampled_from([{"r1": 4.0}, {"r1": 4.0, "r2": 8.0}]))
    plan = replace(
        Plan(),
        cells=[
            {"cell_id": "B0", "role": "baseline", "args": {"max_num_batched_tokens": 8192}, "position": 0},
            *[
                {
                    "cell_id": f"C{i}",
                    "role": "candidate",
                    "args": {"max_num_batched_tokens": 8192 + i},
                    "position": i,
                }
                for i in range(1, candidates + 1)
            ],
        ],
        rates=rates,
        repeats=draw(st.integers(1, 3)),
        per_class=draw(st.sampled_from([30, 60])),
    )
    cells = [c["cell_id"] for c in plan.cells]
    # Per cell: none, one or two troubles, each a (class, failure kind, share of requests hit).
    knobs: dict[tuple[str, str, str], float] = defaultdict(float)
    for cell in cells:
        for cls, kind, share in draw(st.lists(TROUBLES, max_size=2)):
            knobs[(cell, cls, kind)] = share
    speed = {cell: draw(st.sampled_from([100.0, 300.0, 450.0])) for cell in cells}
    by_repeat = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    n_runs = len(plan.cells) * len(rates) * plan.repeats
    order = draw(st.permutations(range(n_runs)))
    agreed = draw(st.sampled_from([None, ["r1"]])) if len(rates) > 1 else None
    return {
        "plan": plan,
        "knobs": knobs,
        "speed": speed,
        "by_repeat": by_repeat,
        "seed": seed,
        "order": order,
        "options": {"agreed_rates": agreed} if agreed else None,
    }


def behaviour_of(spec: Mapping[str, Any]):  # type: ignore[no-untyped-def]
    knobs, speed, seed = defaultdict(float, spec["knobs"]), spec["speed"], spec["seed"]

    def behaviour(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        rng = random.Random(f"{seed}|{cell}|{rate}|{rep if spec['by_repeat'] else 0}|{cls}|{idx}")
        kw: dict[str, Any] = {"ttft_ms": speed[cell] if cls == "short" else 4 * speed[cell]}
        if rng.random() < knobs[(cell, cls, "error")]:
            return {"status": 503, "error_kind": "http"}
        if rng.random() < knobs[(cell, cls, "slow")]:
            kw["ttft_ms"] = 5000.0 if cls == "short" else 9000.0
        if rng.random() < knobs[(cell, cls, "stall")]:
            kw["stall_ms"] = 2000.0
        return kw

    return behaviour


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=result_sets())
def test_early_stopping_never_changes_the_decision_of_a_random_result_set(spec):
    inputs = build_inputs(spec["plan"], behaviour_of(spec))
    full = report_of(inputs, inputs["records"], options=spec["options"])
    left, why = stopped_sweep(inputs, full, finish_order=spec["order"])
    assert_sound(full, why)
    stopped = report_of(left, left["records"], options=spec["options"])
    assert_same_decision(full, stopped)
    assert_same_evidence(full, stopped, why)
    # The plan order names another run, never another verdict.
    _, in_plan_order = stopped_sweep(inputs, full)
    assert set(in_plan_order) <= set(full["checks"]["acceptance"]["cells"])
    assert_sound(full, in_plan_order)


def test_the_random_result_sets_do_stop_cells():
    # Not vacuous: a set whose candidates break their contracts stops them.
    spec = {
        "plan": Plan(),
        "knobs": {(c, cls, "slow"): 0.4 for c in ("C1", "C2") for cls in ("short", "long")},
        "speed": {"B0": 100.0, "C1": 100.0, "C2": 100.0},
        "by_repeat": True,
        "seed": 1,
        "options": None,
    }
    inputs = build_inputs(spec["plan"], behaviour_of(spec))
    full = report_of(inputs, inputs["records"])
    left, why = stopped_sweep(inputs, full)
    assert set(why) == {"C1", "C2"}
    assert_same_decision(full, report_of(left, left["records"]))
