from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from workers.replay.trace import TraceError, trace_read


def _line(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"


HEADER = {"format": "tailtune-trace", "version": 1, "meta": {"warmup_s": 1.0, "observation_s": 2.0}}


def _request(index: int, t: float, **extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "index": index,
        "t_offset_s": t,
        "class": "chat",
        "input_tokens": 3,
        "output_tokens": 5,
        "priority": 0,
        "warmup": t < 1.0,
        "prompt_token_ids": [1, 2, 3],
    }
    base.update(extra)
    return base


def _write(tmp_path: Path, lines: list[object]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(_line(x) for x in lines))
    return path


def test_it_reads_header_meta_and_requests(tmp_path: Path) -> None:
    path = _write(
        tmp_path, [HEADER, _request(0, 0.5), _request(1, 1.5, prompt="text", cancel_after_tokens=2)]
    )
    trace = trace_read(path=path, expected_sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    assert trace.meta["observation_s"] == 2.0
    assert [r["index"] for r in trace.requests] == [0, 1]
    assert trace.requests[1]["cancel_after_tokens"] == 2


def test_it_refuses_a_file_whose_sha256_differs(tmp_path: Path) -> None:
    path = _write(tmp_path, [HEADER, _request(0, 0.5)])
    with pytest.raises(TraceError, match="sha256"):
        trace_read(path=path, expected_sha256="0" * 64)


def test_it_names_the_line_of_a_request_missing_a_field(tmp_path: Path) -> None:
    bad = _request(1, 1.0)
    del bad["output_tokens"]
    path = _write(tmp_path, [HEADER, _request(0, 0.5), bad])
    with pytest.raises(TraceError, match=r"line 3: missing field 'output_tokens'"):
        trace_read(path=path)


def test_it_refuses_requests_out_of_arrival_order(tmp_path: Path) -> None:
    path = _write(tmp_path, [HEADER, _request(0, 0.5), _request(1, 0.2)])
    with pytest.raises(TraceError, match="line 3: t_offset_s goes backwards"):
        trace_read(path=path)


def test_it_refuses_a_missing_or_foreign_header(tmp_path: Path) -> None:
    path = _write(tmp_path, [_request(0, 0.5)])
    with pytest.raises(TraceError, match="line 1: header.format"):
        trace_read(path=path)


def test_it_refuses_a_request_without_any_prompt(tmp_path: Path) -> None:
    bad = _request(0, 0.5)
    del bad["prompt_token_ids"]
    with pytest.raises(TraceError, match="line 2: needs prompt_token_ids, prompt or messages"):
        trace_read(path=_write(tmp_path, [HEADER, bad]))
