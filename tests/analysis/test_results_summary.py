"""The results page's top in plain words (apps/analysis/results_summary.py): pure, no database."""

from __future__ import annotations

from typing import Any

from apps.analysis import results_summary as rs

CLASSES = [
    {
        "name": "short",
        "input_tokens": 64,
        "ttft_p99_ms": 2000.0,
        "e2e_p99_ms": 5000.0,
        "max_stall_ms": 1000.0,
    },
    {
        "name": "long",
        "input_tokens": 1024,
        "ttft_p99_ms": 8000.0,
        "e2e_p99_ms": 12000.0,
        "max_stall_ms": 4000.0,
    },
]


def metric(b0: float, cand: float, ci: list[Any], note: str = "", judged: bool = True) -> dict[str, Any]:
    return {"b0": b0, "candidate": cand, "diff": cand - b0, "ci": ci, "note": note, "judged": judged}


def report() -> dict[str, Any]:
    thin = "not enough requests to judge {} (n=20 < {})"
    return {
        "baseline": "B0",
        "classes": CLASSES,
        "comparisons": [
            {
                "cell": cell,
                "mixture": "80-20",
                "rate": "low",
                "class": "short",
                "primary": "ttft_p99_ms" if cell == "C1" else None,
                "metrics": {
                    "ttft_p99_ms": metric(100.0, 80.0, [-30.0, -10.0]),
                    "ttft_p95_ms": metric(90.0, 70.0, [None, None], thin.format("short ttft p95", 59), False),
                    "e2e_p99_ms": metric(
                        200.0, 190.0, [None, None], thin.format("short e2e p99", 299), False
                    ),
                },
            }
            for cell in ("C1", "C2")
        ],
        "decision": {
            "outcome": "retune",
            "chosen_cell": "C1",
            "rule": "C1 passes every gate with a material gain: short TTFT p99 down 20%",
            "evidence": {
                "candidates": [
                    {
                        "cell": "C1",
                        "eligible": True,
                        "min_goodput_gain": 0.12,
                        "worst_p99_ratio": 0.8,
                        "reasons": [],
                    },
                    {
                        "cell": "C2",
                        "eligible": False,
                        "worst_p99_ratio": 0.9,
                        "reasons": ["no material gain"],
                    },
                ],
                "b0_failures": [],
            },
        },
        "findings": [
            {
                "id": "no_material_gain",
                "title": "no material gain",
                "suggests": "keep the simpler baseline",
                "evidence": [
                    {"comparisons": 2, "material_better": 0},
                    {
                        "cell": "C2",
                        "mixture": "80-20",
                        "rate": "low",
                        "class": "short",
                        "metric": "ttft_p99_ms",
                        "ci": [-55.218983, 1.245905],
                        "diff": -20.0,
                        "threshold": 5.0,
                        "repeat_std": None,
                        "diff_over_threshold": 4.0,
                    },  # fmt: skip
                ],
            }
        ],
        "statistics": {
            "notes": ["not enough requests to judge short ttft p95 (n=20 < 59)", "one repeat: ..."]
        },
    }


def test_it_states_the_decision_and_the_reasons_that_decided_it() -> None:
    r = report()
    top = rs.summary(r, outcome="retune", chosen="C1")
    assert top["headline"] == "Change to C1"
    assert top["reasons"] == [
        "C1 passes every gate with a material gain.",
        "C1 passes every gate, its smallest goodput gain is 12%, its worst p99 is 0.80× B0's.",
    ]


def test_when_b0_stays_it_names_why_the_closest_candidate_lost() -> None:
    decision = {
        "outcome": "retain",
        "chosen_cell": "B0",
        "rule": "B0 keeps every class contract: C2 has no material gain",
        "evidence": {
            "candidates": [
                {"cell": "C3", "worst_p99_ratio": 1.2, "reasons": ["breaks short"]},
                {
                    "cell": "C2",
                    "worst_p99_ratio": 0.9,
                    "reasons": ["not enough requests to judge x", "no material gain"],
                },
            ]
        },
    }
    assert rs.decision_reasons(decision, baseline="B0")[1] == (
        "The closest candidate, C2, is out: too few requests to judge; no material gain."
    )
    assert rs.compared_cell(decision, baseline="B0") == "C2"


def test_the_change_rows_take_the_primary_metric_and_the_contract_limit() -> None:
    rows = rs.change_rows(report(), cell="C1")
    assert [(r["cls"], r["metric"], r["b0"], r["candidate"], r["ci"], r["limit"]) for r in rows] == [
        ("short", "ttft_p99_ms", 100.0, 80.0, (-30.0, -10.0), 2000.0)
    ]
    # Not judgeable (no "primary"): the class's declared primary metric, still against its limit.
    assert rs.change_rows(report(), cell="C2")[0]["metric"] == "ttft_p99_ms"


def test_the_chart_is_an_svg_with_a_row_per_class_and_the_limit() -> None:
    svg = rs.change_chart_svg(rs.change_rows(report(), cell="C1"), cell="C1 <x>")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "short · TTFT p99 · 80-20 @ low" in svg
    assert svg.count("<circle") == 2 and 'stroke="#c0392b"' in svg  # B0, candidate, the limit
    assert "100 → 80.0 (limit 2,000)" in svg  # the numbers in words beside the marks
    assert "C1 &lt;x&gt;" in svg  # names are escaped
    assert rs.change_chart_svg([], cell="C1") == ""


def test_a_finding_is_a_table_never_a_repr() -> None:
    r = report()
    rows = rs.finding_table(r["findings"][0], r)
    assert rows[1] == {
        "cell": "C2 · 80-20 @ low",
        "cls": "short",
        "metric": "TTFT p99 (ms)",
        "b0": "100",
        "candidate": "80.0",
        "change": "-20.0 [-55.2, 1.2]",
        "threshold": "5.0",
        "why": "4.0× the material threshold; the change is not worth its risk",
    }
    assert rows[0]["metric"] == "comparisons 2; material better 0"
    text = repr(rows)
    assert "ci=" not in text and "diff_over_threshold" not in text and "repeat_std" not in text


def test_a_measurement_beside_b0s_becomes_one_row_per_pair() -> None:
    finding = {
        "id": "b0_overloaded",
        "evidence": [
            {"cell": "C1", "mixture": "m", "rate": "r", "class": "short", "itl_p99": 12.0, "b0_itl_p99": 10.0}
        ],
    }
    (row,) = rs.finding_table(finding, {})
    assert (row["metric"], row["b0"], row["candidate"], row["change"]) == ("ITL p99", "10.0", "12.0", "2.0")


def test_the_not_enough_requests_notes_become_one_row_per_point_and_class() -> None:
    rows = rs.thin_rows(report())
    assert rows == [
        {
            "point": "80-20 @ low",
            "cls": "short",
            "requests": 20,
            "needed": "59 (p95) · 299 (p99)",
            "metrics": "59 for TTFT p95 · 299 for E2E p99",
        }
    ]
    assert rs.other_notes(report()["statistics"]["notes"]) == ["one repeat: ..."]


def test_values_read_as_numbers_with_their_censoring() -> None:
    assert rs.fmt(1234.5678) == "1,235"
    assert rs.fmt(None) == "—"
    assert rs.fmt({"value": 3.21}) == "3.2"
    assert rs.fmt({"censored": True, "above": 900.0}) == "above 900"
    assert rs.metric_words("e2e_p95_ms") == "E2E p95 (ms)"


def test_a_class_that_pays_for_throughput_gets_a_row_per_metric_it_lost() -> None:
    finding = {
        "id": "throughput_up_class_loses",
        "evidence": [
            {
                "cell": "C2", "mixture": "80-20", "rate": "low", "tokens_per_s": 778.0, "b0_tokens_per_s": 777.0,
                "losses": [{"class": "short", "metric": "e2e_p99_ms", "b0": 3380.0, "candidate": 3764.0,
                            "diff": 384.0, "ci": [115.0, 543.0]}],
            }
        ],
    }  # fmt: skip
    loss, tokens = rs.finding_table(finding, {})
    assert (loss["cls"], loss["metric"], loss["change"]) == ("short", "E2E p99 (ms)", "384 [115, 543]")
    assert (tokens["metric"], tokens["change"]) == ("tokens per s", "1.0")


def test_a_percentile_in_the_evidence_reads_as_its_value() -> None:
    finding = {
        "id": "short_requests_wait",
        "evidence": [{"cell": "B0", "short_ttft_p99": {"ms": 602.4, "censored": False}, "limit_ms": 500.0}],
    }
    (row,) = rs.finding_table(finding, {})
    assert row["metric"] == "short TTFT p99 602" and row["threshold"] == "500"
