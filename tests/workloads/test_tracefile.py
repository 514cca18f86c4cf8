from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.workloads.tracefile import (
    Trace,
    TraceFormatError,
    TraceRequest,
    trace_dumps,
    trace_loads,
    trace_sha256,
)


def _trace() -> Trace:
    return Trace(
        meta={"warmup_s": 1.0, "corpus_sha256": "x", "note": "caf\u00e9"},
        requests=[
            TraceRequest(0, 0.5, "short", 3, 4, 0, True, prompt_token_ids=[7, 8, 9]),
            TraceRequest(1, 1.0, "long", 2, 5, 1, False, prompt_token_ids=[10, 11], hash_ids=[1]),
            TraceRequest(2, 2.1234567, "short", 1, 1, 0, False, prompt="hi", cancel_after_tokens=0),
        ],
    )


def test_it_writes_canonical_jsonl_and_reads_it_back_byte_for_byte() -> None:
    data = trace_dumps(_trace())
    lines = data.decode("ascii").split("\n")
    assert lines[-1] == ""
    assert lines[0].startswith('{"format":"tailtune-trace","meta":{')
    assert '"note":"caf\\u00e9"' in lines[0]
    assert json.loads(lines[3])["t_offset_s"] == 2.123457
    assert trace_dumps(trace_loads(data)) == data
    assert trace_sha256(data) == hashlib.sha256(data).hexdigest()
    parsed = trace_loads(data)
    assert parsed.requests[1].hash_ids == [1]
    assert parsed.requests[2].prompt == "hi"
    assert parsed.prompts() == [[7, 8, 9], [10, 11], "hi"]


def _lines() -> list[dict]:
    return [json.loads(line) for line in trace_dumps(_trace()).decode().splitlines()]


def _dump(objs: list[dict]) -> bytes:
    return "".join(json.dumps(o, sort_keys=True, separators=(",", ":")) + "\n" for o in objs).encode()


def _edit(line: int, **changes: object) -> bytes:
    objs = _lines()
    for key, value in changes.items():
        if value is ...:
            del objs[line - 1][key]
        else:
            objs[line - 1][key] = value
    return _dump(objs)


@pytest.mark.parametrize(
    ("data", "line", "fragment"),
    [
        (b"", 1, "empty file"),
        (_dump(_lines())[:-1], 4, "newline"),
        (_dump(_lines()).replace(b'"index":1,', b'"index": 1,'), 3, "not canonical"),
        (_dump(_lines()).replace(b'{"format"', b'{"formats"'), 1, "header"),
        (_dump(_lines()).replace(b"\n{", b"\nnot json{", 1), 2, "not valid JSON"),
        ("\u00e9\n".encode(), 1, "non-ASCII"),
        (_edit(3, index=5), 3, "index must be 1"),
        (_edit(3, t_offset_s=0.25), 3, "not in arrival order"),
        (_edit(2, t_offset_s=-0.5), 2, "negative"),
        (_edit(3, t_offset_s=1), 3, "decimal number"),
        (_edit(3, input_tokens="2"), 3, "input_tokens must be an integer"),
        (_edit(3, output_tokens=0), 3, "output_tokens must be at least 1"),
        (_edit(3, priority=True), 3, "priority must be an integer"),
        (_edit(3, warmup=True), 3, "warm-up"),
        (_edit(2, warmup=0), 2, "warmup must be true or false"),
        (_edit(3, **{"class": ""}), 3, "class"),
        (_edit(3, prompt_token_ids=[10]), 3, "holds 1 tokens but input_tokens is 2"),
        (_edit(4, prompt=...), 4, "prompt_token_ids, prompt or messages"),
        (_edit(4, messages=[{"role": "user", "content": "x"}]), 4, "messages go without prompt"),
        (_edit(4, prompt=..., messages=[{"role": "tool", "content": "x"}]), 4, "messages[0].role"),
        (
            _edit(4, prompt=..., messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]),
            4,
            "text content",
        ),
        (_edit(3, surprise=1), 3, "unknown field(s): surprise"),
        (_edit(3, output_tokens=...), 3, "missing field(s): output_tokens"),
        (_edit(3, hash_ids=[1, -1]), 3, "hash_ids"),
        (_edit(2, t_offset_s=0.1234567), 2, "6 decimals"),
    ],
)
def test_it_refuses_malformed_traces_naming_the_line(data: bytes, line: int, fragment: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        trace_loads(data)
    assert info.value.line == line
    assert fragment in info.value.message


def test_it_refuses_booleans_and_floats_among_token_ids() -> None:
    for bad in ([10, True], [10, 11.0]):
        with pytest.raises(TraceFormatError, match="list of integers") as info:
            trace_loads(_edit(3, prompt_token_ids=bad))
        assert info.value.line == 3


_request_parts = st.tuples(
    st.floats(0, 1e5, allow_nan=False),
    st.text(min_size=1, max_size=8),
    st.lists(st.integers(0, 300_000), min_size=1, max_size=20),
    st.integers(1, 10_000),
    st.integers(-5, 5),
    st.one_of(st.none(), st.text(min_size=1, max_size=20)),
)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(_request_parts, max_size=12), warmup=st.floats(0, 1e5, allow_nan=False))
def test_it_round_trips_any_valid_trace_byte_for_byte(parts: list, warmup: float) -> None:
    times = sorted(round(p[0], 6) for p in parts)
    requests = [
        TraceRequest(i, t, klass, len(ids), out, prio, t < warmup, prompt_token_ids=ids, prompt=text)
        for i, (t, (_, klass, ids, out, prio, text)) in enumerate(zip(times, parts, strict=True))
    ]
    data = trace_dumps(Trace(meta={"warmup_s": warmup, "x": [1.5, "\u2603"]}, requests=requests))
    assert trace_dumps(trace_loads(data)) == data
