"""What bounds a class's tail (apps/analysis/tail_bound.py): the rule table row by row, then the
diagnosis on a whole report and its row in the findings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from apps.analysis.tail_bound import KNOBS, BoundEvidence, diagnose, itl_vs_batch, shares
from tests.analysis.builders import Plan
from tests.analysis.spans import build_with_spans, usable


def parts(queue: float, prefill: float, front: float = 1.0, network: float = 1.0) -> dict[str, float | None]:
    return {
        "queue_ms": queue,
        "prefill_ms": prefill,
        "front_end_ms": front,
        "server_rest_ms": None,
        "network_ms": network,
        "send_delay_ms": 0.0,
    }


def ttft(queue: float, prefill: float, front: float = 1.0, network: float = 1.0, **kw: Any) -> BoundEvidence:
    return BoundEvidence(
        tail="ttft",
        tail_ms=queue + prefill + front + network,
        parts=parts(queue, prefill, front, network),
        **kw,
    )


GROWING = {"runs": 4, "slope_ms_per_seq": 0.8, "r": 0.93}

# (id, evidence, bound, cause)
TABLE = [
    ("queue-behind-long-prefills", ttft(900, 60, next_to_longer=True, kv_max=0.4, running_max=3, max_num_seqs=64),
     "queue", "behind longer prefills"),
    ("queue-kv-full", ttft(900, 60, next_to_longer=True, kv_max=0.97), "queue", "kv cache pressure"),
    ("queue-preempting", ttft(900, 60, kv_max=0.5, preemptions=4), "queue", "kv cache pressure"),
    ("queue-at-sequence-limit", ttft(900, 60, running_max=8, max_num_seqs=8, kv_max=0.5), "queue", "sequence limit"),
    ("queue-scheduling-order", ttft(900, 60, running_max=3, max_num_seqs=64, kv_max=0.5), "queue", "scheduling order"),
    ("prefill-bound", ttft(100, 800, next_to_longer=True), "prefill", "long prefill"),
    ("tie-goes-to-the-queue", ttft(400, 400), "queue", "scheduling order"),
    ("outside-the-engine", ttft(10, 20, front=30, network=300), "outside the engine", "client, network or front end"),
    ("decode-bound-e2e", BoundEvidence(tail="e2e", tail_ms=1000, ttft_ms=100, decode_ms=880, after_ms=20,
                                       parts=parts(60, 38), itl_vs_batch=GROWING), "decode", "batch"),
    ("e2e-queue-bound", BoundEvidence(tail="e2e", tail_ms=1000, ttft_ms=800, decode_ms=190, after_ms=10,
                                      parts=parts(700, 98)), "queue", "scheduling order"),
    ("e2e-decode-without-span", BoundEvidence(tail="e2e", tail_ms=1000, ttft_ms=100, decode_ms=890, after_ms=10),
     "decode", "batch"),
    ("e2e-ttft-unsplit", BoundEvidence(tail="e2e", tail_ms=1000, ttft_ms=700, decode_ms=290, after_ms=10),
     "unknown", "no split"),
    ("no-split", BoundEvidence(tail="ttft", tail_ms=500.0), "unknown", "no split"),
    ("per-run-queue", BoundEvidence(tail="ttft", tail_ms=100, per_request=False, source="histograms",
                                    parts={"queue_ms": 70, "server_rest_ms": 20, "network_ms": 10}),
     "queue", "scheduling order"),
    ("per-run-prefill-or-front-end", BoundEvidence(tail="ttft", tail_ms=100, per_request=False, source="histograms",
                                                   parts={"queue_ms": 10, "server_rest_ms": 80, "network_ms": 10}),
     "prefill", "long prefill"),
    ("stall-next-to-long-prompts", BoundEvidence(tail="stall", stall_p99_ms=900, itl_p99_ms=20, next_to_longer=True),
     "prefill", "long-prefill stall"),
    ("stall-alone", BoundEvidence(tail="stall", stall_p99_ms=300, itl_p99_ms=40), "decode", "batch"),
    ("stall-unknown", BoundEvidence(tail="stall"), "unknown", "no split"),
]  # fmt: skip


@pytest.mark.parametrize(("evidence", "bound", "cause"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_the_rule_table_names_the_bound_its_cause_and_its_knobs(evidence, bound, cause) -> None:
    got = diagnose(evidence)
    assert got[:2] == (bound, cause)
    assert got[2] == KNOBS[(bound, cause)]


def test_every_bound_points_at_the_knobs_the_issue_names() -> None:
    assert {"max_num_batched_tokens", "enable_chunked_prefill"} <= set(KNOBS[("prefill", "long prefill")])
    assert {"max_num_batched_tokens", "enable_chunked_prefill"} <= set(
        KNOBS[("prefill", "long-prefill stall")]
    )
    assert {"max_num_seqs", "kv_cache_memory_bytes"} <= set(KNOBS[("decode", "batch")])
    assert "scheduling_policy" in KNOBS[("queue", "scheduling order")]
    assert any("isolation" in k for k in KNOBS[("queue", "scheduling order")])
    assert KNOBS[("outside the engine", "client, network or front end")] == []


def test_shares_are_of_the_tail_requests_own_time() -> None:
    sh = shares(ttft(75, 20, front=3, network=2))
    assert (sh["queue"], sh["prefill"], sh["outside"]) == (0.75, 0.2, 0.05)
    e2e = shares(
        BoundEvidence(tail="e2e", tail_ms=1000, ttft_ms=100, decode_ms=880, after_ms=20, parts=parts(60, 38))
    )
    assert (e2e["decode"], e2e["ttft"], e2e["queue"], e2e["outside"]) == (0.88, 0.1, 0.06, 0.022)


def _run(cell: str, running: float | None, itl: float | None) -> dict[str, Any]:
    return {
        "cell": cell,
        "status": "done",
        "scenario": "",
        "server": {"gauges": {"running": {"mean": running}}},
        "classes": {"short": {"itl_ms": {"p50": itl}}},
    }


@pytest.mark.parametrize(
    ("pairs", "runs", "slope", "r"),
    [
        ([(1, 10), (2, 12), (4, 16)], 3, 2.0, 1.0),
        ([(2, 10), (2, 12)], 2, None, None),  # one batch size: nothing to fit
        ([(1, 10), (None, 12), (3, None)], 1, None, None),
    ],
)
def test_itl_against_the_batch_is_fitted_over_the_cells_runs(pairs, runs, slope, r) -> None:
    results = [_run("B0", x, y) for x, y in pairs] + [_run("C1", 9.0, 99.0)]
    fit = itl_vs_batch(results, "B0", "short")
    assert fit["runs"] == runs
    assert fit["slope_ms_per_seq"] == (pytest.approx(slope) if slope is not None else None)
    assert fit["r"] == (pytest.approx(r) if r is not None else None)


def _short_waits_under_b0(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    if cls == "short":
        return {"ttft_ms": 900.0 if cell == "B0" and idx % 10 == 0 else 60.0}
    return {"ttft_ms": 2000.0}


def _split(cell: str, key: str, rec: Any) -> tuple[float, float, float]:
    ttft_ms = (rec.first_token_ns - rec.planned_ns) / 1e6
    if rec.request_class == "long":
        return 100.0, ttft_ms - 110.0, 5.0  # a long prompt's own prefill
    return ttft_ms - 40.0, 30.0, 5.0  # a short request's wait is its queue


def test_a_short_class_waiting_behind_long_prefills_is_diagnosed_queue_bound_with_its_knobs() -> None:
    plan = replace(Plan(), cells=Plan().cells[:2], per_class=120)
    report = build_with_spans(plan, _short_waits_under_b0, _split, spans=lambda run: usable())
    bounds = {(t["cell"], t["class"]): t for t in report["tail_bounds"]}
    short = bounds[("B0", "short")]
    assert (short["tail"], short["bound"], short["cause"]) == ("ttft", "queue", "behind longer prefills")
    assert short["per_request"] is True and short["shares"]["queue"] > 0.9
    assert "enable_chunked_prefill" in short["knobs"] and "queue-bound" in short["why"]
    # The long class is judged on its end-to-end tail, where its own prefill dominates.
    assert (bounds[("B0", "long")]["tail"], bounds[("B0", "long")]["bound"]) == ("e2e", "prefill")
    finding = next(f for f in report["findings"] if f["id"] == "tail_bound")
    row = next(e for e in finding["evidence"] if (e["cell"], e["class"]) == ("B0", "short"))
    assert (row["bound"], row["cause"]) == ("queue", "behind longer prefills")
    assert "max_num_batched_tokens" in row["knobs"]
    assert finding["cells"] == ["B0", "C1"]


def test_invalid_cells_get_no_diagnosis_row_in_the_findings() -> None:
    plan = replace(Plan(), cells=Plan().cells[:2], per_class=60)

    def lag_c1(run: dict[str, Any]) -> None:
        if run["cell"] == "C1":
            run["dispatch_lag_p99_ms"] = 500.0

    report = build_with_spans(plan, _short_waits_under_b0, _split, run_overrides=lag_c1)
    assert report["checks"]["validity"]["invalid_cells"] == ["C1"]
    assert {t["cell"] for t in report["tail_bounds"]} == {"B0"}
    finding = next(f for f in report["findings"] if f["id"] == "tail_bound")
    assert finding["cells"] == ["B0"]


def test_a_short_class_whose_streams_also_stall_behind_long_prefills_says_so() -> None:
    """The long-prefill stall decodes suffer shows beside the short class's queue, with its knobs."""
    plan = replace(Plan(), cells=Plan().cells[:2], per_class=60)

    def stalls_under_b0(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        out = _short_waits_under_b0(cell, mix, rate, rep, cls, idx)
        if cls == "short" and cell == "B0":
            out["stall_ms"] = 400.0  # over the short class's 250 ms limit
        return out

    report = build_with_spans(plan, stalls_under_b0, _split)
    bounds = {(t["cell"], t["class"]): t for t in report["tail_bounds"]}
    b0, c1 = bounds[("B0", "short")], bounds[("C1", "short")]
    assert b0["evidence"]["long_prefill_stall"] is True and b0["evidence"]["stall_p99_ms"] == 400.0
    assert "stall behind longer prefills: max stall p99 400.0 ms over its 250 ms limit" in b0["why"]
    assert c1["evidence"]["long_prefill_stall"] is False and "stall behind" not in c1["why"]
