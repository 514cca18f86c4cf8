"""The A/A control cell in the report (issue #34 item 6): B0's config run again, marked
``control``. Its observed difference from B0 is the measured noise floor beside every
comparison, and it is never the retune, whatever its numbers show."""

from __future__ import annotations

from typing import Any

from apps.analysis.decide import CONTROL_REASON
from apps.analysis.results_charts import comparison_rows, noise_floor_text, signed_pct
from tests.analysis.builders import Plan, build

B0_ARGS = {"max_num_batched_tokens": 8192, "max_num_seqs": 64}


def _plan(*, marked: bool) -> Plan:
    plan = Plan()
    aa: dict[str, Any] = {"cell_id": "AA", "role": "candidate", "args": dict(B0_ARGS), "position": 3}
    if marked:
        aa["control"] = True
    plan.cells = [*plan.cells[:2], aa]  # B0, C1, AA
    return plan


def c1_better_aa_near_b0(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    # B0 400 ms short TTFT, its A/A copy a little slower in each round, C1 far faster.
    if cls == "short":
        return {"ttft_ms": {"B0": 400.0, "AA": 404.0 + rep, "C1": 100.0}[cell]}
    return {}


def aa_looks_better(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    # Only the A/A cell is faster (noise, a warmer host): it must never be the recommendation.
    if cls == "short":
        return {"ttft_ms": {"B0": 400.0, "AA": 100.0 + rep, "C1": 400.0}[cell]}
    return {}


def test_every_comparison_shows_the_aa_cells_difference_from_b0_as_the_noise_floor() -> None:
    report = build(_plan(marked=True), c1_better_aa_near_b0)
    assert {c["cell_id"]: c.get("control", False) for c in report["cells"]} == {
        "B0": False,
        "C1": False,
        "AA": True,
    }
    comparisons = report["comparisons"]
    assert {c["cell"] for c in comparisons} == {"C1", "AA"}
    own = {(c["mixture"], c["rate"], c["class"]): c for c in comparisons if c["cell"] == "AA"}
    short_seen = False
    for c in comparisons:
        floor = c["noise_floor"]
        assert floor["aa_cell"] == "AA"
        metric = floor["metric"]
        aa_verdict = own[(c["mixture"], c["rate"], c["class"])]["metrics"][metric]
        assert floor["aa_ci"] == aa_verdict["ci"]
        if aa_verdict["diff"] is None:
            assert floor["aa_diff"] is None and floor["aa_diff_rel"] is None
            continue
        assert floor["aa_diff"] == aa_verdict["diff"]
        assert floor["aa_diff_rel"] == round(aa_verdict["diff"] / aa_verdict["b0"], 6)
        if c["class"] == "short":
            short_seen = True
            # The copy ran 4-6 ms slower than B0's 400 ms: a small positive difference.
            assert 0.005 < floor["aa_diff_rel"] < 0.02, floor
            text = noise_floor_text(floor)
            assert text is not None
            assert (
                f"measured noise floor: A/A cell AA (B0 run again) {signed_pct(floor['aa_diff_rel'])}" in text
            )
    assert short_seen
    assert report["decision"]["outcome"] == "retune" and report["decision"]["chosen_cell"] == "C1"
    rows = comparison_rows(comparisons, mixture="mix", rate="r1")
    assert {(r["cell"], r["control"]) for r in rows} == {("C1", False), ("AA", True)}


def test_the_aa_cell_is_never_the_retune_even_when_it_looks_better() -> None:
    unmarked = build(_plan(marked=False), aa_looks_better)
    # Without the mark the same numbers would retune to the copy of B0: the mark is what stops it.
    assert unmarked["decision"]["outcome"] == "retune" and unmarked["decision"]["chosen_cell"] == "AA"
    report = build(_plan(marked=True), aa_looks_better)
    decision = report["decision"]
    assert decision["outcome"] == "retain" and decision["chosen_cell"] == "B0"
    considered = {c["cell"]: c for c in decision["evidence"]["candidates"]}
    assert considered["AA"]["eligible"] is False
    assert considered["AA"]["reasons"][0] == CONTROL_REASON
    # Nor is it in the gain family that sizes the bootstrap and Holm's correction.
    members = {c["cell"] for c in report["comparisons"] for v in c["metrics"].values() if v.get("in_family")}
    assert "AA" not in members
    unmarked_members = {
        c["cell"] for c in unmarked["comparisons"] for v in c["metrics"].values() if v.get("in_family")
    }
    assert "AA" in unmarked_members


def test_the_aa_cell_is_not_among_the_cells_that_keep_every_contract_when_b0_breaks_one() -> None:
    def b0_breaks(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        # B0 and C1 break the short TTFT contract (500 ms); only the A/A copy keeps it (noise).
        if cls == "short":
            return {"ttft_ms": {"B0": 900.0, "AA": 300.0, "C1": 900.0}[cell]}
        return {}

    report = build(_plan(marked=True), b0_breaks)
    decision = report["decision"]
    assert decision["outcome"] == "isolate", decision["rule"]
    assert "AA" not in decision["evidence"].get("passing", [])
