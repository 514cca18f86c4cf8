"""Natural-length replay (workload.output_mode: natural): the request leaves the length to the
model, a shorter answer is valid, the report compares within output-length strata and shows stop
reasons, and a cell whose output tokens drift from B0's is invalid."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from apps.analysis import lengths
from tests.analysis.builders import Plan, build
from workers.replay.client import request_body


def test_an_exact_request_forces_its_length_and_a_natural_one_only_caps_it() -> None:
    request = {"prompt_token_ids": [1, 2, 3], "output_tokens": 64}
    exact = json.loads(request_body(request, model="m", endpoint="completions", extra_body={}))
    natural = json.loads(
        request_body(request, model="m", endpoint="completions", extra_body={}, output_mode="natural")
    )
    assert exact["max_tokens"] == exact["min_tokens"] == 64 and exact["ignore_eos"] is True
    assert natural["max_tokens"] == 64 and "min_tokens" not in natural and "ignore_eos" not in natural


def test_strata_bucket_the_tokens_each_request_got() -> None:
    tokens = np.array([1, 5, 31, 32, 100, 600, 5000])
    e2e = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0])
    rows = {s["tokens"]: s for s in lengths.strata(tokens, e2e)}
    assert list(rows) == ["1-31", "32-127", "128-511", "512-2047", "2048+"]
    assert rows["1-31"]["requests"] == 3 and rows["1-31"]["e2e_p99_ms"] == 30.0
    assert rows["32-127"]["requests"] == 2 and rows["128-511"]["requests"] == 0
    assert rows["128-511"]["e2e_p99_ms"] is None and rows["2048+"]["share"] == round(1 / 7, 6)


def shorter(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    # B0 answers in 16 tokens; C1 stops at 12 (a quarter fewer); C2 like B0.
    return {"tokens": 12} if cell == "C1" else {}


def test_a_shorter_answer_is_valid_in_natural_mode_and_not_in_exact_mode() -> None:
    exact = build(Plan(), shorter)
    c1 = next(r for r in exact["runs"] if r["cell"] == "C1")
    assert c1["classes"]["short"]["counts"]["validated"] == 0
    natural = build(Plan(), shorter, output_mode="natural")
    c1 = next(r for r in natural["runs"] if r["cell"] == "C1")
    assert c1["classes"]["short"]["counts"]["validated"] == c1["classes"]["short"]["counts"]["completed"] > 0
    assert natural["output_mode"] == "natural" and exact["output_mode"] == "exact"


def test_a_cell_that_emits_fewer_tokens_than_b0_is_invalid_and_the_strata_show_it() -> None:
    report = build(Plan(), shorter, output_mode="natural")
    validity = report["checks"]["validity"]
    assert validity["invalid_cells"] == ["C1"]
    problem = next(p for p in validity["problems"] if p["problem"] == "output lengths differ from B0")
    assert problem["relative_shift"] == {"short": -0.25, "long": -0.25}
    strata = {
        a["cell"]: {s["tokens"]: s["requests"] for s in a["pooled"]["output_strata"]}
        for a in report["aggregates"]
        if a["class"] == "short"
    }
    assert strata["B0"]["1-31"] == strata["C1"]["1-31"] == 180
    # Exact mode reports no strata: every request has its one length.
    assert "output_strata" not in build(Plan(), shorter)["aggregates"][0]["pooled"]


def test_stop_reasons_are_reported_per_cell_and_class() -> None:
    def reasons(cell: str) -> dict[str, dict[str, int]]:
        return {"short": {"stop": 50, "length": 10}, "long": {"length": 60}} if cell == "C1" else {}

    keys: dict[str, str] = {}
    first = build(Plan(), shorter, output_mode="natural")
    for r in first["runs"]:
        keys[r["key"]] = r["cell"]
    report = build(
        Plan(), shorter, output_mode="natural", stop_reasons={k: reasons(c) for k, c in keys.items()}
    )
    assert report["stop_reasons"]["C1"] == {"long": {"length": 180}, "short": {"length": 30, "stop": 150}}
    assert "B0" not in report["stop_reasons"]


def test_a_cell_that_drops_requests_is_not_mistaken_for_a_length_shift() -> None:
    # C1 fails a fifth of its short requests (503) but answers the rest at B0's length: the
    # mean length per completed request is unchanged, so the cell stays valid (the drop is a
    # regression for the comparison to find, not invalid data).
    def drops(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        if cell == "C1" and cls == "short" and idx % 5 == 0:
            return {"status": 503, "error_kind": "http"}
        return {}

    validity = build(Plan(), drops, output_mode="natural")["checks"]["validity"]
    assert not any(p["problem"] == "output lengths differ from B0" for p in validity["problems"])
