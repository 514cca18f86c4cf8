from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.replay.helpers import make_requests
from tests.replay.mockserver import Behaviour, MockConfig, MockServer
from workers.replay.records import RequestRecord


def _write_trace(path: Path, requests: list[dict[str, object]], meta: dict[str, object]) -> None:
    header = {"format": "tailtune-trace", "version": 1, "meta": meta}
    lines = [header, *requests]
    path.write_text("".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines))


def test_it_replays_a_trace_file_and_writes_jsonl_records(tmp_path: Path) -> None:
    requests = make_requests(12, spacing_s=0.02, output_tokens=6)
    for request in requests[:4]:
        request["warmup"] = True
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, requests, {"warmup_s": 0.08, "observation_s": 0.16, "drain_deadline_s": 5})
    out = tmp_path / "records.jsonl"
    stdout = io.StringIO()
    config = MockConfig(default=Behaviour(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=2))
    config.by_index[5] = Behaviour(status=500)
    with MockServer(config) as server:
        call_command(
            "replay",
            "--base-url",
            server.base_url,
            "--model",
            "mock",
            "--trace",
            str(trace),
            "--out",
            str(out),
            "--tolerance-ms",
            "1000",
            "--run-id",
            "cli-run",
            stdout=stdout,
            stderr=io.StringIO(),
        )
    records = [RequestRecord.from_json(json.loads(line)) for line in out.read_text().splitlines()]
    assert sorted(r.index for r in records) == list(range(12))
    by_index = {r.index: r for r in records}
    assert by_index[5].http_status == 500 and by_index[5].error_kind == "http"
    assert all(r.run_id == "cli-run" for r in records)
    assert all(r.output_tokens == 6 for r in records if r.index != 5)
    assert [r.warmup for r in sorted(records, key=lambda r: r.index)] == [True] * 4 + [False] * 8
    text = stdout.getvalue()
    assert "12/12 sent, 11 ok, 1 errors" in text
    assert "VALID" in text
    # One row per class in the summary table (warm-up excluded: 4 of each class remain).
    table = {
        line.split()[0]: line.split()
        for line in text.splitlines()
        if line.split()[:1] in (["batch"], ["chat"])
    }
    assert table["batch"][1] == "4" and table["chat"][1] == "4"


def test_it_recomputes_warmup_flags_from_the_warmup_option(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, make_requests(6, spacing_s=0.02, output_tokens=2), {})
    out = tmp_path / "records.jsonl"
    with MockServer(MockConfig(default=Behaviour(ttft_s=0.005, itl_s=0.001))) as server:
        call_command(
            "replay",
            f"--base-url={server.base_url}",
            "--model=mock",
            f"--trace={trace}",
            f"--out={out}",
            "--warmup=0.05",
            "--tolerance-ms=1000",
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    flags = {r["index"]: r["warmup"] for r in map(json.loads, out.read_text().splitlines())}
    assert flags == {0: True, 1: True, 2: True, 3: False, 4: False, 5: False}


def test_it_names_the_bad_line_of_a_broken_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    requests = make_requests(2)
    del requests[1]["class"]
    _write_trace(trace, requests, {})
    with pytest.raises(CommandError, match="line 3: missing field 'class'"):
        call_command(
            "replay",
            "--base-url=http://127.0.0.1:9",
            "--model=m",
            f"--trace={trace}",
            f"--out={tmp_path / 'out.jsonl'}",
        )
