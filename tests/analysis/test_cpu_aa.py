"""The A/A result set recorded on the CPU vLLM (issue #32) never ends in a retune.

tests/analysis/fixtures/cpu_aa/ holds a real experiment (README.md there says when, how and on
what it was recorded: bench/analysis/record_aa.py): B0 and C1 with exactly the same arguments,
replaying the same frozen trace in three repeat rounds. Its records go through the real
build_report, with no database and no engine.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from apps.analysis.report_types import Report
from tests.analysis.recorded import recorded_report, report_inputs

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu_aa"
# The records as recorded (sha256 of the uncompressed JSONL): another set in their place fails here.
RECORDS_SHA256 = "1cefacbbb3c7b52d2221b4cda0ae8da3c470d03c9023a2ea9af970aac84bad3d"


@pytest.fixture(scope="module")
def inputs() -> dict[str, Any]:
    return report_inputs(FIXTURE)


@pytest.fixture(scope="module")
def report() -> Report:
    return recorded_report(FIXTURE)


def test_it_is_the_recorded_set() -> None:
    raw = gzip.decompress((FIXTURE / "records.jsonl.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == RECORDS_SHA256
    recording = json.loads((FIXTURE / "recording.json").read_text())
    assert recording["records"] == raw.count(b"\n")
    assert recording["hardware_id"].startswith("cpu: ")


def test_it_is_an_aa_set_of_three_rounds_on_one_trace(inputs: dict[str, Any]) -> None:
    cells = {c["cell_id"]: c for c in inputs["cells"]}
    assert set(cells) == {"B0", "C1"}
    assert cells["C1"]["args"] == cells["B0"]["args"] and cells["C1"]["engine"] == cells["B0"]["engine"]
    assert cells["B0"]["args"]["enable_chunked_prefill"] is False
    sweep = [r for r in inputs["runs"] if not r["scenario"]]
    assert all(r["status"] == "done" for r in sweep)
    rounds: dict[int, dict[str, dict[str, Any]]] = {}
    for r in sweep:
        rounds.setdefault(r["repeat"], {})[r["cell"]] = r
    assert len(rounds) == 3
    for by_cell in rounds.values():
        assert set(by_cell) == {"B0", "C1"}
        b0, c1 = by_cell["B0"], by_cell["C1"]
        assert (c1["trace_sha256"], c1["corpus_sha256"]) == (b0["trace_sha256"], b0["corpus_sha256"])
        # What vLLM reported it ran with (the port aside, every server's own).
        for key in (*cells["B0"]["args"], "max_model_len", "kv_cache_memory_bytes", "kv_cache_size_tokens"):
            assert c1["effective_args"][key] == b0["effective_args"][key], key
    # Same frozen trace in every round (repeat_traces: same).
    assert len({r["trace_sha256"] for r in sweep}) == 1
    # Every run's records are in the table.
    assert set(inputs["table"].run_keys) == {r["key"] for r in sweep}


def test_the_verdict_is_retain_or_inconclusive_never_retune(report: Report) -> None:
    decision = report["decision"]
    assert decision["outcome"] in ("retain", "inconclusive"), decision
    # The same comparison under the second seed does not retune either.
    assert decision["seed_check"]["outcome"] in ("retain", "inconclusive")


def test_the_identical_candidate_is_neither_materially_better_nor_worse(report: Report) -> None:
    considered = {c["cell"]: c for c in report["decision"]["evidence"].get("candidates", [])}
    assert "C1" in considered
    assert considered["C1"]["material_better"] == []
    assert considered["C1"]["material_worse"] == []
    called = [
        (c["class"], name, m["direction"])
        for c in report["comparisons"]
        if c["cell"] == "C1"
        for name, m in c["metrics"].items()
        if m["material"] or m["worse"]
    ]
    assert called == []


def test_each_comparison_carries_the_noise_floor_measured_from_the_aa_cell(report: Report) -> None:
    comparisons = [c for c in report["comparisons"] if c["cell"] == "C1"]
    assert {c["class"] for c in comparisons} == {"short", "long"}
    for c in comparisons:
        floor = c["noise_floor"]
        assert floor["aa_cell"] == "C1"
        assert floor["repeats"] == 3
        for key in ("b0_run_sd_rel", "aa_run_sd_rel", "pooled_run_sd_rel", "used_run_sd_rel"):
            assert isinstance(floor[key], float) and math.isfinite(floor[key]) and floor[key] > 0, (
                key,
                floor,
            )
        assert floor["df"] == 2
