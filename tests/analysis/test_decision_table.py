"""Each finding and each decision outcome, from synthetic records."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.analysis.builders import Plan, build, gauges, healthy


def slow_short_b0(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    # B0 keeps the contract but short TTFT is 400 ms; C1 brings it to 100 ms, C2 to 200 ms.
    if cls == "short":
        return {"ttft_ms": {"B0": 400.0, "C1": 100.0, "C2": 200.0}[cell]}
    return {}


def stalls_everywhere(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    return {"stall_ms": 400.0} if cls == "short" else {}


def short_waits(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    return {"ttft_ms": 800.0} if cls == "short" else {}


def throughput_trade(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    # B0 and C2 reject a fifth of the short requests; C1 serves them all but long TTFT triples.
    if cell in ("B0", "C2") and cls == "short" and idx % 5 == 0:
        return {"status": 503, "error_kind": "http"}
    if cell == "C1" and cls == "long":
        return {"ttft_ms": 3000.0}
    if cls == "long":
        return {"ttft_ms": 1000.0}
    return {}


def long_unfinished(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    if cell == "C1" and cls == "long" and idx % 10 == 3:
        return {"ttft_ms": None, "unfinished": True}
    return {}


def stall_only_next_to_long(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    return {"stall_ms": 400.0} if (cls == "short" and mix == "mix") else {}


def preempting(run: dict[str, Any]) -> list[dict[str, Any]]:
    return gauges(run, preemptions={"B0": 50.0, "C1": 5.0, "C2": 20.0}[run["cell"]])


def fail_one_b0_run(run: dict[str, Any]) -> None:
    if run["cell"] == "B0" and run["repeat"] == 1:
        run["status"] = "failed"


def other_trace_for_c2(run: dict[str, Any]) -> None:
    if run["cell"] == "C2" and run["repeat"] == 2:
        run["trace_sha256"] = "another"


TWO_MIXTURES = replace(Plan(), mixtures={"short-only": {"short": 1.0}, "mix": {"short": 0.5, "long": 0.5}})

CASES = [
    # id, plan, behaviour, build kwargs, outcome, chosen cell, findings that must be present
    ("retain", Plan(), healthy, {}, "retain", "B0", {"no_material_gain"}),
    ("retune", Plan(), slow_short_b0, {}, "retune", "C1", set()),
    ("isolate", Plan(), stalls_everywhere, {}, "isolate", "B0", {"stall_during_prefill"}),
    ("short-wait", Plan(), short_waits, {}, "isolate", "B0", {"short_requests_wait"}),
    ("throughput", Plan(), throughput_trade, {}, "inconclusive", "B0", {"throughput_up_class_loses"}),
    ("long-unfinished", Plan(), long_unfinished, {}, "retain", "B0", {"long_requests_never_finish"}),
    (
        "stall-vs-short-only",
        TWO_MIXTURES,
        stall_only_next_to_long,
        {},
        "isolate",
        "B0",
        {"stall_during_prefill"},
    ),
    (
        "preemptions",
        Plan(),
        healthy,
        {"samples": preempting},
        "retain",
        "B0",
        {"preemptions_rise_with_max_num_seqs", "no_material_gain"},
    ),
    ("b0-missing", Plan(), slow_short_b0, {"run_overrides": fail_one_b0_run}, "inconclusive", "B0", set()),
]


@pytest.mark.parametrize(
    ("plan", "behaviour", "kwargs", "outcome", "chosen", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_it_reaches_the_expected_decision_and_findings(plan, behaviour, kwargs, outcome, chosen, expected):
    report = build(plan, behaviour, **kwargs)
    found = {f["id"] for f in report["findings"]}
    assert report["decision"]["outcome"] == outcome, report["decision"]
    assert report["decision"]["chosen_cell"] == chosen
    assert expected <= found, found
    for f in report["findings"]:
        assert f["evidence"], f"finding {f['id']} carries no evidence"
    json.dumps(report, allow_nan=False)


def test_it_names_the_cells_and_numbers_behind_a_finding():
    report = build(Plan(), long_unfinished)
    finding = next(f for f in report["findings"] if f["id"] == "long_requests_never_finish")
    assert finding["cells"] == ["C1"]
    assert {e["unfinished"] for e in finding["evidence"]} == {12}
    # A tenth unfinished: the error rate breaks, and so does every p99 (it is censored).
    c1 = report["checks"]["acceptance"]["cells"]["C1"]
    assert not c1["passed"]
    assert {tuple(f["broken"]) for f in c1["failures"]} == {("ttft", "e2e", "stall", "error_rate")}
    assert all(f["e2e_p99"]["censored"] for f in c1["failures"])


def test_it_shows_the_material_gain_that_made_a_retune():
    report = build(Plan(), slow_short_b0)
    cmp = next(c for c in report["comparisons"] if c["cell"] == "C1" and c["class"] == "short")
    # 180 short requests: the primary TTFT is judged at p95 (p99 needs 299).
    assert cmp["primary"] == "ttft_p95_ms"
    assert cmp["metrics"]["ttft_p99_ms"]["judged"] is False
    ttft = cmp["metrics"]["ttft_p95_ms"]
    assert ttft["diff"] == pytest.approx(-300.0)
    assert ttft["material"] and ttft["direction"] == "better"
    assert ttft["in_family"] and ttft["p_better_adj"] <= 0.05
    assert ttft["ci"][1] < 0
    assert ttft["repeat_diffs"] == [pytest.approx(-300.0)] * 3
    long_cmp = next(c for c in report["comparisons"] if c["cell"] == "C1" and c["class"] == "long")
    assert all(not v["material"] for v in long_cmp["metrics"].values())


def test_it_ranks_the_best_candidate_deterministically():
    # C1 and C2 both pass with a gain; C1's short TTFT ratio is the lower.
    first = build(Plan(), slow_short_b0)
    second = build(Plan(), slow_short_b0)
    assert first == second
    ranked = {c["cell"]: c for c in first["decision"]["evidence"]["candidates"]}
    assert ranked["C1"]["eligible"] and ranked["C2"]["eligible"]


def test_it_marks_a_cell_with_another_trace_invalid_and_never_chooses_it():
    def only_c2_better(cell, mix, rate, rep, cls, idx):
        return {"ttft_ms": 100.0} if (cell == "C2" and cls == "short") else {"ttft_ms": 400.0}

    report = build(Plan(), only_c2_better, run_overrides=other_trace_for_c2)
    validity = report["checks"]["validity"]
    assert validity["status"] == "fail"
    assert validity["invalid_cells"] == ["C2"]
    assert any(p["problem"].startswith("trace_sha256 differs") for p in validity["problems"])
    assert report["decision"]["outcome"] == "retain"


def test_it_invalidates_a_cell_whose_dispatch_lag_is_over_tolerance():
    def laggy(run):
        if run["cell"] == "C1":
            run["dispatch_lag_p99_ms"] = 40.0

    report = build(Plan(), slow_short_b0, run_overrides=laggy)
    assert report["checks"]["validity"]["invalid_cells"] == ["C1"]
    assert report["decision"]["outcome"] == "retune"
    assert report["decision"]["chosen_cell"] == "C2"


def test_it_lists_failure_scenario_runs_apart_from_the_sweep():
    def scenario(run):
        if run["repeat"] == 2 and run["cell"] in ("B0", "C1"):
            run["scenario"] = "long-burst"

    report = build(Plan(), long_unfinished, run_overrides=scenario)
    listed = report["checks"]["failure_scenarios"]["runs"]
    assert [(r["scenario"], r["cell"]) for r in listed] == [("long-burst", "B0"), ("long-burst", "C1")]
    assert listed[0]["held"] and not listed[1]["held"]
    assert listed[1]["classes"]["long"]["unfinished"] == 12


def test_check_4_is_measured_by_the_rehearsal_not_by_the_manifest():
    kept = build(Plan(), healthy, rollback={"exists": True, "baseline": "B0"})
    assert kept["decision"]["chosen_cell"] == "B0"
    assert kept["checks"]["recovery"]["status"] == "not needed"
    assert kept["checks"]["recovery"]["manifest"] is True
    # A retune: a manifest alone proves nothing; the proposed cell's rehearsal decides.
    retune = build(Plan(), slow_short_b0, rollback={"exists": True, "baseline": "B0"})
    assert retune["decision"]["chosen_cell"] == "C1"
    assert retune["checks"]["recovery"]["status"] == "pending"
    assert build(Plan(), slow_short_b0, rehearse=False)["checks"]["recovery"]["status"] == "not rehearsed"
    measures = {"passed": True, "problems": [], "time_to_recover_s": 4.0, "max_recovery_s": 60.0, "cut": 2}
    passed = build(
        Plan(), slow_short_b0, rehearsals={"C1": {"run": "r1", "status": "done", "measures": measures}}
    )
    assert passed["checks"]["recovery"]["status"] == "pass"
    assert passed["rehearsals"]["C1"]["run"] == "r1"
    other = build(
        Plan(), slow_short_b0, rehearsals={"C2": {"run": "r2", "status": "done", "measures": measures}}
    )
    assert other["checks"]["recovery"]["status"] == "pending"  # C2's rehearsal says nothing about C1


def test_it_judges_only_the_agreed_rates():
    plan = replace(Plan(), rates={"low": 2.0, "high": 6.0})

    def breaks_at_high(cell, mix, rate, rep, cls, idx):
        return {"stall_ms": 400.0} if (rate == "high" and cls == "short") else {}

    assert build(plan, breaks_at_high)["decision"]["outcome"] == "isolate"
    agreed = build(plan, breaks_at_high, options={"agreed_rates": ["low"]})
    assert agreed["decision"]["outcome"] == "retain"


def test_it_warns_when_no_run_recorded_the_hardware_but_invalidates_a_cell_that_alone_lacks_it():
    def nobody(run):
        run["hardware_id"] = ""

    report = build(Plan(), healthy, run_overrides=nobody)
    assert report["checks"]["validity"]["status"] == "pass"
    assert report["checks"]["validity"]["warnings"] == [
        "no run recorded hardware_id: cells cannot be checked for it"
    ]

    def only_c1(run):
        if run["cell"] == "C1":
            run["hardware_id"] = ""

    assert build(Plan(), healthy, run_overrides=only_c1)["checks"]["validity"]["invalid_cells"] == ["C1"]


def _scenario_run(key: str, scenario: str, contract_met: bool) -> dict[str, Any]:
    counts = dict.fromkeys(
        ("offered", "completed", "rejected", "errors", "timeouts", "cancelled", "unfinished"), 0
    )
    return {
        "key": key,
        "scenario": scenario,
        "cell": "B0",
        "mixture": "mix",
        "rate": "r1",
        "repeat": 0,
        "status": "done",
        "classes": {
            "long": {
                "counts": counts,
                "contract": {"met": contract_met},
                "ttft_ms": {"p99": 1.0},
                "e2e_ms": {"p99": 2.0},
                "oldest_queue_age_ms": 3.0,
            }
        },
    }


def test_it_judges_scenarios_by_their_verdicts_and_leaves_probe_runs_out() -> None:
    from apps.analysis.checks import scenario_check

    runs = [
        _scenario_run("probe", "calibration", True),
        # A burst is meant to break the long class's contract; what must hold is the scenario's own claim.
        _scenario_run("burst", "long_burst", False),
        _scenario_run("kv", "kv_pressure", True),
    ]
    verdicts = {"burst": {"held": True, "shown": True}, "kv": {"held": True, "shown": False}}
    check = scenario_check(runs, verdicts)
    assert [r["run"] for r in check["runs"]] == ["kv", "burst"]
    by_run = {r["run"]: r for r in check["runs"]}
    assert by_run["burst"]["held"] and not by_run["kv"]["held"]
    assert check["status"] == "listed"
    assert scenario_check(runs[:1])["status"] == "none"


def b0_and_c1_break_c2_keeps(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    # Short TTFT breaks its 500 ms limit on B0 and C1; C2 keeps it.
    if cls == "short":
        return {"ttft_ms": 200.0 if cell == "C2" else 800.0}
    return {}


def c2_laggy(run: dict[str, Any]) -> None:
    if run["cell"] == "C2":
        run["dispatch_lag_p99_ms"] = 40.0


def c1_throughput_up_long_worse(
    cell: str, mix: str, rate: str, rep: int, cls: str, idx: int
) -> dict[str, Any]:
    # C1 streams more tokens and its long TTFT triples; C2 would fire the same finding.
    if cell in ("C1", "C2") and cls == "long":
        return {"ttft_ms": 3000.0, "tokens": 24, "expected": 24}
    if cls == "long":
        return {"ttft_ms": 1000.0}
    return {}


def c1_other_trace(run: dict[str, Any]) -> None:
    if run["cell"] == "C1" and run["repeat"] == 1:
        run["trace_sha256"] = "another"


def c1_faster_but_invalid(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    return {"ttft_ms": 100.0 if cell == "C1" else 400.0} if cls == "short" else {}


CORRECTIONS = [
    # id, behaviour, run_overrides, outcome, findings that must be present
    (
        "only-passing-cell-invalid",
        b0_and_c1_break_c2_keeps,
        c2_laggy,
        "inconclusive",
        set(),
    ),
    (
        "invalid-cell-loses-no-finding",
        c1_throughput_up_long_worse,
        c1_other_trace,
        "retain",
        {"throughput_up_class_loses"},
    ),
    (
        "invalid-cell-gain-is-no-gain",
        c1_faster_but_invalid,
        c1_other_trace,
        "retain",
        {"no_material_gain"},
    ),
]


@pytest.mark.parametrize(
    ("behaviour", "overrides", "outcome", "present"),
    [c[1:] for c in CORRECTIONS],
    ids=[c[0] for c in CORRECTIONS],
)
def test_it_keeps_invalid_cells_out_of_the_verdict_and_the_findings(behaviour, overrides, outcome, present):
    report = build(Plan(), behaviour, run_overrides=overrides)
    invalid = report["checks"]["validity"]["invalid_cells"]
    assert invalid, "the case needs an invalid cell"
    assert report["decision"]["outcome"] == outcome, report["decision"]["rule"]
    found = {f["id"]: f for f in report["findings"]}
    assert present <= set(found), found.keys()
    for f in found.values():
        assert not set(f["cells"]) & set(invalid), f"{f['id']} rests on invalid cell(s) {invalid}"


def test_it_calls_an_invalid_only_passing_cell_a_rerun_not_isolation():
    report = build(Plan(), b0_and_c1_break_c2_keeps, run_overrides=c2_laggy)
    decision = report["decision"]
    assert decision["outcome"] == "inconclusive"
    assert "rerun" in decision["rule"] and decision["evidence"]["passing_invalid"] == ["C2"]
    # Valid, the same C2 is adopted: it repairs what B0 broke.
    valid = build(Plan(), b0_and_c1_break_c2_keeps)
    assert (valid["decision"]["outcome"], valid["decision"]["chosen_cell"]) == ("retune", "C2")


def test_a_candidate_that_names_its_own_model_revision_is_held_to_it():
    """The spec's candidates[].engine.model_revision: that cell must run that revision, the others
    the experiment's; any other mismatch stays invalid."""
    plan = Plan()
    plan.cells[1] = {**plan.cells[1], "engine": {"model_revision": "m2"}}

    def revisions(c2_runs: str):  # type: ignore[no-untyped-def]
        def apply(run: dict) -> None:
            if run["cell"] == "C1":
                run["model_revision"] = "m2"
            if run["cell"] == "C2":
                run["model_revision"] = c2_runs

        return apply

    ok = build(plan, healthy, run_overrides=revisions("m1"))["checks"]["validity"]
    assert ok["invalid_cells"] == [], ok["problems"]
    bad = build(plan, healthy, run_overrides=revisions("m2"))["checks"]["validity"]
    assert bad["invalid_cells"] == ["C2"]
    wrong = build(replace(plan, cells=[plan.cells[0], {**plan.cells[1], "engine": {"model_revision": "m3"}}]),
                  healthy, run_overrides=revisions("m1"))["checks"]["validity"]  # fmt: skip
    assert wrong["invalid_cells"] == ["C1"]
    assert any(p["problem"] == "model_revision differs" and p["expected"] == "m3" for p in wrong["problems"])


def test_a_cell_whose_requests_carried_other_sampling_settings_is_invalid():
    """Each run records the sampling fields its requests carried; the experiment's are
    ``{"temperature": 0.0}``. A run that recorded nothing is not judged on it (imported results)."""

    def sent(c1: dict | None):  # type: ignore[no-untyped-def]
        def apply(run: dict) -> None:
            run["generation"] = c1 if run["cell"] == "C1" else {"temperature": 0.0}

        return apply

    same = build(Plan(), healthy, run_overrides=sent({"temperature": 0.0}))["checks"]["validity"]
    assert same["invalid_cells"] == [], same["problems"]
    unrecorded = build(Plan(), healthy, run_overrides=sent(None))["checks"]["validity"]
    assert unrecorded["invalid_cells"] == []
    for other in ({"temperature": 0.7}, {"temperature": 0.0, "seed": 1}, {}):
        bad = build(Plan(), healthy, run_overrides=sent(other))["checks"]["validity"]
        assert bad["invalid_cells"] == ["C1"], other
        problem = next(p for p in bad["problems"] if p["problem"] == "generation settings differ")
        assert problem["value"] == other and problem["expected"] == {"temperature": 0.0}


def test_every_finding_is_one_registered_function_and_documented() -> None:
    from pathlib import Path

    from apps.analysis.findings import FINDINGS, REGISTRY

    assert list(REGISTRY) == list(FINDINGS)
    assert all(callable(f) and f.__name__ == fid for fid, f in REGISTRY.items())
    doc = (Path(__file__).resolve().parents[2] / "docs" / "ANALYSIS.md").read_text()
    table = doc.split("## Findings", 1)[1].split("\n## ", 1)[0]
    documented = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert documented == list(REGISTRY)
