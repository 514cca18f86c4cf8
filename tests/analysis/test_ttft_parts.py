"""Where a class's TTFT goes (apps/analysis/ttft_parts.py): the p50 and p99 requests' own parts
from vLLM's spans, the runs whose spans are not used, and the per-run histogram fallback."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from tests.analysis.builders import CLASSES, Plan
from tests.analysis.spans import build_with_spans, row_of, usable

SHORT_ONLY = Plan(
    cells=[Plan().cells[0], Plan().cells[1]],
    classes=[dict(c) for c in CLASSES],
    mixtures={"mix": {"short": 1.0}},
    repeats=1,
    per_class=100,
)
# The cohort's indices run 2..101 (two warm-up requests first): the slowest three have their own
# times, every other request 50 ms = queue 10 + prefill 20 + front end 5 + network 15.
SLOW = {101: 1000.0, 100: 800.0, 99: 700.0}
SLOW_SPLIT = {101: (900.0, 50.0, 10.0), 100: (100.0, 650.0, 10.0), 99: (600.0, 50.0, 10.0)}


def ttfts(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    return {"ttft_ms": SLOW.get(idx, 50.0)}


def split(cell: str, key: str, rec: Any) -> tuple[float, float, float] | None:
    return SLOW_SPLIT.get(rec.index, (10.0, 20.0, 5.0))


def nearest_rank(values: list[float], q: float) -> float:
    return sorted(values)[math.ceil(q * len(values)) - 1]


def test_the_p99_row_is_the_p99_requests_own_parts_not_a_sum_of_p99s() -> None:
    report = build_with_spans(SHORT_ONLY, ttfts, split)
    row = row_of(report, "B0", "short")
    assert (row["source"], row["per_request"], row["requests"], row["joined"]) == ("spans", True, 100, 100)
    p99 = row["p99"]
    # Rank ceil(0.99 x 100) = 99: the 800 ms request (index 100), split as vLLM saw it.
    assert (p99["ttft_ms"], p99["rank"], p99["rank_used"], p99["substitute"]) == (800.0, 99, 99, False)
    assert p99["request"] == {"run": "B0-mix-r1-0", "index": 100}
    assert p99["parts"] == {
        "queue_ms": 100.0,
        "prefill_ms": 650.0,
        "front_end_ms": 10.0,
        "server_rest_ms": None,
        "network_ms": 40.0,
        "send_delay_ms": 0.0,
    }
    # Each part's own p99 comes from other requests: their sum is nobody's TTFT.
    queues = [SLOW_SPLIT.get(i, (10.0, 20.0, 5.0))[0] for i in range(2, 102)]
    prefills = [SLOW_SPLIT.get(i, (10.0, 20.0, 5.0))[1] for i in range(2, 102)]
    assert (nearest_rank(queues, 0.99), nearest_rank(prefills, 0.99)) == (600.0, 50.0)
    assert p99["parts"]["queue_ms"] != nearest_rank(queues, 0.99)
    # The pooled TTFT p99 the report shows elsewhere is the same request's.
    pooled = next(a for a in report["aggregates"] if (a["cell"], a["class"]) == ("B0", "short"))
    assert pooled["pooled"]["ttft_ms"]["p99"]["ms"] == p99["ttft_ms"]
    assert row["p50"]["parts"]["queue_ms"] == 10.0 and row["p50"]["ttft_ms"] == 50.0
    json.dumps(report, allow_nan=False)


def test_the_parts_add_up_to_the_split_requests_ttft_with_a_late_send() -> None:
    def late(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        return {"ttft_ms": SLOW.get(idx, 50.0), "late_ms": 3.0}

    report = build_with_spans(SHORT_ONLY, late, split)
    for row in report["ttft_parts"]["rows"]:
        for q in ("p50", "p99"):
            at = row[q]
            total = sum(v for v in at["parts"].values() if v is not None)
            assert total == pytest.approx(at["request_ttft_ms"], abs=1e-6), (row["cell"], q)
            assert at["parts"]["send_delay_ms"] == 3.0


@pytest.mark.parametrize(
    ("missing", "rank_used", "index", "queue"),
    [
        ({100}, 100, 101, 900.0),  # the slower neighbour first on a tie
        ({100, 101}, 98, 99, 600.0),
        (set(), 99, 100, 100.0),
    ],
    ids=["p99-request-not-joined", "slower-ones-not-joined-either", "all-joined"],
)
def test_a_p99_request_without_a_span_is_replaced_by_the_nearest_joined_one(
    missing, rank_used, index, queue
) -> None:
    def partial(cell: str, key: str, rec: Any) -> tuple[float, float, float] | None:
        return None if rec.index in missing else split(cell, key, rec)

    row = row_of(build_with_spans(SHORT_ONLY, ttfts, partial), "B0", "short")
    p99 = row["p99"]
    assert (p99["rank_used"], p99["request"]["index"], p99["parts"]["queue_ms"]) == (rank_used, index, queue)
    assert p99["substitute"] is bool(missing)
    assert p99["ttft_ms"] == 800.0  # the class's p99 stays the rank-99 request's
    assert p99["request_ttft_ms"] == {101: 1000.0, 99: 700.0, 100: 800.0}[index]
    assert (row["joined"], row["joined_share"]) == (100 - len(missing), (100 - len(missing)) / 100)
    if missing:
        assert "no joined span" in p99["note"]


def test_a_run_whose_spans_are_not_used_is_left_out_and_named() -> None:
    plan = replace(SHORT_ONLY, repeats=2)

    def slow_second_b0(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        return {"ttft_ms": 5000.0 if (cell, rep) == ("B0", 1) else SLOW.get(idx, 50.0)}

    report = build_with_spans(
        plan,
        slow_second_b0,
        split,
        spans=lambda run: usable(0.8) if run["key"] == "B0-mix-r1-1" else usable(),
    )
    row = row_of(report, "B0", "short")
    assert row["runs"] == ["B0-mix-r1-0"] and row["runs_total"] == 2
    assert row["requests"] == 100
    [left] = row["runs_without_spans"]
    assert left["run"] == "B0-mix-r1-1" and "80.0%" in left["reason"] and "95%" in left["reason"]
    # The slow run's requests are not in the split: its p99 is the used run's.
    assert row["p99"]["ttft_ms"] == 800.0
    assert "1 of 2 runs left out" in row["note"]
    # C1 used both.
    assert row_of(report, "C1", "short")["runs"] == ["C1-mix-r1-0", "C1-mix-r1-1"]


def test_a_p99_among_the_requests_that_got_no_first_token_has_nothing_to_split() -> None:
    def rejected(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        return {"status": 429} if idx >= 97 else {"ttft_ms": 50.0}

    p99 = row_of(build_with_spans(SHORT_ONLY, rejected, split), "B0", "short")["p99"]
    assert p99["censored"] is True and p99["ttft_ms"] is None and p99["above_ms"] is not None
    assert p99["parts"] is None and "no first token" in p99["note"]


def histogram(name: str, buckets: list[list[Any]], t_ns: int, phase: str) -> dict[str, Any]:
    count = buckets[-1][1]
    return {
        "t_ns": t_ns,
        "phase": phase,
        "epoch": 0,
        "name": name,
        "labels": {"model_name": "m"},
        "kind": "histogram",
        "value": count,
        "histogram": {"buckets": buckets, "sum": 1.0, "count": count},
    }


def scraped(run: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's queue-time and TTFT histograms before and after the run."""
    zero_q = [[0.01, 0], [0.1, 0], [1.0, 0], ["+Inf", 0]]
    zero_t = [[0.025, 0], [0.05, 0], [0.1, 0], [1.0, 0], ["+Inf", 0]]
    return [
        histogram("vllm:request_queue_time_seconds", zero_q, 0, "before"),
        histogram("vllm:time_to_first_token_seconds", zero_t, 0, "before"),
        histogram("vllm:request_queue_time_seconds", [[0.01, 90], [0.1, 99], [1.0, 100], ["+Inf", 100]], 12 * 10**9, "after"),
        histogram("vllm:time_to_first_token_seconds", [[0.025, 0], [0.05, 90], [0.1, 95], [1.0, 100], ["+Inf", 100]], 12 * 10**9, "after"),
    ]  # fmt: skip


def test_without_usable_spans_it_falls_back_to_the_per_run_histograms() -> None:
    report = build_with_spans(SHORT_ONLY, ttfts, split, spans=lambda run: None, samples=scraped)
    row = row_of(report, "B0", "short")
    assert (row["source"], row["per_request"], row["joined"]) == ("histograms", False, 0)
    assert "per run, not per request" in row["note"] and "per run, not per request" in row["p50"]["note"]
    assert {w["reason"] for w in row["runs_without_spans"]} == {"no server spans recorded"}
    p50 = row["p50"]
    assert p50["request"] is None and p50["ttft_ms"] == 50.0
    # Queue p50: rank 50 of 100 in the first bucket (0-10 ms, 90 requests); TTFT p50 in 25-50 ms.
    assert p50["parts"]["queue_ms"] == pytest.approx(10 * 50 / 90, abs=1e-3)
    server_ttft = 25 + 25 * 50 / 90
    assert p50["parts"]["server_rest_ms"] == pytest.approx(server_ttft - 10 * 50 / 90, abs=2e-3)
    assert p50["parts"]["network_ms"] == pytest.approx(50 - server_ttft, abs=2e-3)
    assert p50["parts"]["prefill_ms"] is None and p50["parts"]["front_end_ms"] is None


def test_a_point_with_neither_spans_nor_histograms_is_not_split() -> None:
    row = row_of(build_with_spans(SHORT_ONLY, ttfts, split, spans=lambda run: {"source": "none", "used": False, "reason": "the engine exported no spans"}), "B0", "short")  # fmt: skip
    assert (row["source"], row["p99"]["parts"]) == ("none", None)
    assert row["runs_without_spans"][0]["reason"] == "the engine exported no spans"
    assert row["p99"]["ttft_ms"] == 800.0  # the class's TTFT is still the records'


def test_the_split_columns_are_optional_in_a_table() -> None:
    """A table built without the span fields (an older database) reads them as not joined."""
    from apps.analysis.columns import SCALAR_FIELDS, RecordTable

    table = RecordTable.from_columns(
        run_keys=["r"],
        run=[0],
        class_names=["short"],
        request_class=[0],
        columns={
            f: [1] if f not in ("warmup", "sent", "cancelled", "unfinished") else [False]
            for f in SCALAR_FIELDS
        },
        error_kind=[None],
    )
    assert np.isnan(table.server("server_queue_ns")).all()
    with pytest.raises(ValueError, match="server_nope"):
        table.server("server_nope")
    both = RecordTable.concat([table, table])
    assert len(both.server("server_ttft_ns")) == 2
