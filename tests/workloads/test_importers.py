from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apps.workloads.importers import (
    TraceImportError,
    assign_classes,
    busiest_window,
    cap_to_context,
    parse_trace_bytes,
    read_trace_file,
    scale_time,
    select_window,
)
from tests.workloads.conftest import FIXTURES


def test_it_reads_the_real_azure_conversation_trace(azure_conv: Path) -> None:
    trace = read_trace_file(azure_conv, fmt="azure")
    assert len(trace) == 19_366
    assert trace.repairs == []
    assert trace.t_s[0] == 0.0
    assert np.all(np.diff(trace.t_s) >= 0)
    # First two rows: 18:15:46.6805900 and 18:15:50.9951690, 7 digits kept.
    assert trace.t_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert (trace.input_tokens[0], trace.output_tokens[0]) == (374, 44)


def test_it_parses_azure_2023_timestamps_to_100_ns() -> None:
    trace = read_trace_file(FIXTURES / "azure_2023.csv", fmt="azure")
    assert list(trace.input_tokens) == [374, 396, 5000, 879]
    assert trace.t_s[2] - trace.t_s[1] == pytest.approx(0.0048311, abs=1e-10)
    assert trace.t_s[3] == pytest.approx(323.81941, abs=1e-9)


def test_it_parses_azure_2024_timestamps_with_a_zone() -> None:
    trace = read_trace_file(FIXTURES / "azure_2024.csv", fmt="azure")
    assert len(trace) == 3
    assert trace.t_s[1] == pytest.approx(0.004964, abs=1e-12)
    assert list(trace.output_tokens) == [5, 3, 300]


def test_it_applies_non_utc_offsets() -> None:
    data = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 01:00:00+01:00,1,1\n2024-01-01 00:00:01+00:00,1,1\n"
    trace = parse_trace_bytes(data, fmt="azure")
    assert list(trace.t_s) == [0.0, 1.0]
    assert trace.repairs == []


def test_it_keeps_failed_burstgpt_rows_flagged_and_counted() -> None:
    trace = read_trace_file(FIXTURES / "burstgpt_v1.csv", fmt="burstgpt")
    assert len(trace) == 4
    assert list(trace.failed) == [False, True, False, False]
    assert list(trace.t_s) == [0.0, 40.0, 113.0, 113.0]
    assert any("1 failed" in n for n in trace.notes)


def test_it_reads_the_newer_burstgpt_columns_by_name() -> None:
    trace = read_trace_file(FIXTURES / "burstgpt_v2.csv", fmt="burstgpt")
    assert list(trace.input_tokens) == [100, 200, 300]
    assert list(trace.output_tokens) == [20, 0, 30]
    assert list(trace.t_s) == [0.0, 1.0, 2.5]
    assert int(trace.failed.sum()) == 1


def test_it_reads_mooncake_in_milliseconds_and_keeps_hash_ids() -> None:
    trace = read_trace_file(FIXTURES / "mooncake.jsonl", fmt="mooncake")
    assert list(trace.t_s) == [0.0, 0.0, 3.052]
    assert trace.block_tokens == 512
    assert trace.hash_ids is not None
    assert trace.hash_ids[0][:12] == trace.hash_ids[1][:12]
    assert trace.hash_ids[2] == [1, 2]


def test_it_reads_vllm_timed_trace_with_its_multiplier_and_block_size() -> None:
    trace = read_trace_file(FIXTURES / "vllm_timed.jsonl", fmt="vllm-timed")
    assert list(trace.t_s) == [0.0, 0.25, 1.5]
    assert trace.block_tokens == 16
    assert trace.hash_ids == [[1, 2, 3], [1, 2, 9], []]
    ms = read_trace_file(
        FIXTURES / "vllm_timed.jsonl", fmt="vllm-timed", sec_multiplier=0.001, block_tokens=64
    )
    assert list(ms.t_s) == [0.0, 0.00025, 0.0015]
    assert ms.block_tokens == 64


def test_it_sorts_unsorted_rows_stably_and_reports_the_repair() -> None:
    data = (
        b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        b"10,a,1,1,2,x\n5,b,2,1,3,x\n10,c,3,1,4,x\n5,d,4,1,5,x\n"
    )
    trace = parse_trace_bytes(data, fmt="burstgpt")
    assert list(trace.input_tokens) == [2, 4, 1, 3]  # equal times keep file order
    assert list(trace.source_lines) == [3, 5, 2, 4]
    assert len(trace.repairs) == 1
    assert "line 3" in trace.repairs[0]


HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_ROW = b"2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    ("fmt", "data", "line", "fragment"),
    [
        ("azure", b"", 1, "empty file"),
        ("azure", b"\n\r\n", 1, "empty file"),
        ("azure", HEADER, 1, "no data rows"),
        ("azure", b"TIMESTAMP,Context,Generated\n" + GOOD_ROW, 1, "header"),
        (
            "azure",
            HEADER + GOOD_ROW + b"2023-11-16 18:15:47.0,abc,44\n",
            3,
            "ContextTokens must be a whole number",
        ),
        (
            "azure",
            HEADER + GOOD_ROW + b"2023-11-16 18:15:47.0,12,-4\n",
            3,
            "GeneratedTokens must not be negative",
        ),
        ("azure", HEADER + b"16/11/2023 18:15,1,1\n", 2, "TIMESTAMP"),
        ("azure", HEADER + b"2023-02-30 00:00:00,1,1\n", 2, "day is out of range"),
        ("azure", HEADER + b"2023-11-16 25:00:00,1,1\n", 2, "out of range"),
        ("azure", HEADER + GOOD_ROW + b"2023-11-16 18:15:47.0+00:00,1,1\n", 3, "mixed"),
        ("azure", HEADER + GOOD_ROW + b"\n" + GOOD_ROW, 3, "empty line"),
        ("azure", HEADER + GOOD_ROW + b"2023-11-16 18:15:47.0,1\n", 3, "3 comma-separated"),
        ("azure", HEADER + b"\xff\xfe,1,1\n", 2, "UTF-8"),
        ("burstgpt", b"Timestamp,Model,Request tokens\n1,a,2\n", 1, "missing Response tokens"),
        (
            "burstgpt",
            b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Extra\n",
            1,
            "unknown",
        ),
        (
            "burstgpt",
            b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,a,2,3,5,x\nsoon,a,2,3,5,x\n",
            3,
            "Timestamp must be a number",
        ),
        (
            "burstgpt",
            b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n-1,a,2,3,5,x\n",
            2,
            "Timestamp must not be negative",
        ),
        (
            "burstgpt",
            b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,a,2\n",
            2,
            "expected 6",
        ),
        ("mooncake", b'{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,', 2, "JSON"),
        ("mooncake", b'{"timestamp": 0, "input_length": 5}\n', 1, "output_length"),
        ("mooncake", b'{"timestamp": 0, "input_length": 5, "output_length": 1}\n[1]\n', 2, "JSON object"),
        ("mooncake", b'{"timestamp": -3, "input_length": 5, "output_length": 1}\n', 1, "negative"),
        (
            "mooncake",
            b'{"timestamp": "x", "input_length": 5, "output_length": 1}\n',
            1,
            "timestamp must be a number",
        ),
        ("mooncake", b'{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n', 1, "whole number"),
        ("mooncake", b'{"timestamp": 0, "input_length": -5, "output_length": 1}\n', 1, "negative"),
        (
            "vllm-timed",
            b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, -2]}\n',
            1,
            "hash_ids",
        ),
        ("vllm-timed", b'{"timestamp": 0, "input_length": 5, "output_length": true}\n', 1, "whole number"),
    ],
)
def test_it_refuses_bad_input_naming_the_line(fmt: str, data: bytes, line: int, fragment: str) -> None:
    with pytest.raises(TraceImportError) as info:
        parse_trace_bytes(data, fmt=fmt)
    assert info.value.line == line
    assert fragment in info.value.message
    assert str(info.value).startswith(f"line {line}: ")


def test_it_refuses_a_file_over_the_size_cap_before_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    path.write_bytes(HEADER + GOOD_ROW * 100)
    with pytest.raises(TraceImportError) as info:
        read_trace_file(path, fmt="azure", max_bytes=1024)
    assert "1 KiB import limit" in str(info.value)
    assert info.value.line is None
    with pytest.raises(TraceImportError, match="import limit"):
        parse_trace_bytes(HEADER + GOOD_ROW * 100, fmt="azure", max_bytes=1024)


def test_it_refuses_an_unknown_format() -> None:
    with pytest.raises(TraceImportError, match="unknown trace format"):
        parse_trace_bytes(HEADER + GOOD_ROW, fmt="sharegpt")


def _burst(times: list[float], inputs: list[int] | None = None, outputs: list[int] | None = None) -> bytes:
    inputs = inputs or [10] * len(times)
    outputs = outputs or [5] * len(times)
    rows = "".join(f"{t},m,{i},{o},{i + o},x\n" for t, i, o in zip(times, inputs, outputs, strict=True))
    return ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + rows).encode()


def test_it_selects_a_window_and_rebases_its_times() -> None:
    trace = parse_trace_bytes(_burst([0, 1, 2, 3, 4, 5]), fmt="burstgpt")
    window = select_window(trace, start_s=2.0, length_s=3.0)
    assert list(window.t_s) == [0.0, 1.0, 2.0]
    assert list(window.source_lines) == [4, 5, 6]
    assert window.window == {"start_s": 2.0, "length_s": 3.0}
    with pytest.raises(TraceImportError, match="no arrivals"):
        select_window(trace, start_s=100.0, length_s=3.0)


def test_it_finds_the_busiest_window_earliest_on_ties() -> None:
    trace = parse_trace_bytes(_burst([0, 10, 10.5, 11, 30, 30.2, 30.4, 50]), fmt="burstgpt")
    busiest = busiest_window(trace, length_s=2.0)
    assert busiest.window == {"start_s": 10.0, "length_s": 2.0}
    assert len(busiest) == 3


def test_it_scales_time_for_faster_replay() -> None:
    trace = parse_trace_bytes(_burst([0, 2, 4]), fmt="burstgpt")
    fast = scale_time(trace, speed=2.0)
    assert list(fast.t_s) == [0.0, 1.0, 2.0]
    assert fast.speed == 2.0
    assert list(trace.t_s) == [0.0, 2.0, 4.0]
    with pytest.raises(TraceImportError):
        scale_time(trace, speed=0)


def test_it_caps_rows_to_the_context_and_counts_them() -> None:
    trace = parse_trace_bytes(
        _burst([0, 1, 2, 3], [100, 3000, 4090, 10], [10, 200, 10, 9000]), fmt="burstgpt"
    )
    capped = cap_to_context(trace, max_model_len=4096)
    assert list(capped.input_tokens) == [100, 3000, 4086, 1]
    assert list(capped.output_tokens) == [10, 200, 10, 4095]
    assert capped.capped_rows == 2
    assert all(i + o <= 4096 for i, o in zip(capped.input_tokens, capped.output_tokens, strict=True))


def test_it_assigns_classes_by_input_thresholds() -> None:
    labels = assign_classes(np.array([1, 1024, 1025, 9000]), [("short", 1024), ("long", None)])
    assert labels == ["short", "short", "long", "long"]
    three = assign_classes(np.array([5, 50, 500]), [("a", 10), ("b", 100), ("c", None)])
    assert three == ["a", "b", "c"]
    with pytest.raises(TraceImportError, match="unbounded"):
        assign_classes(np.array([1]), [("short", 1024)])
    with pytest.raises(TraceImportError, match="increase"):
        assign_classes(np.array([1]), [("a", 100), ("b", 10), ("c", None)])
