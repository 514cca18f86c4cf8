"""The single-file remote client: flags, reports and exit codes (no server, no engine)."""

from __future__ import annotations

import ast
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from clients import tailtune_gate as client

CLIENT = Path(client.__file__)


def test_it_imports_only_the_standard_library_and_httpx() -> None:
    tree = ast.parse(CLIENT.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots - {"httpx", "__future__"} <= set(sys.stdlib_module_names), roots


def test_overlay_parsing() -> None:
    assert client.parse_overlay(
        "max_num_seqs=8, enable_chunked_prefill=false,scheduling_policy=priority", "x"
    ) == {
        "max_num_seqs": 8,
        "enable_chunked_prefill": False,
        "scheduling_policy": "priority",
    }
    for bad in ("max_num_seqs", "=3", "a=1,a=2"):
        with pytest.raises(client.GateError, match="--candidate-args"):
            client.parse_overlay(bad, "--candidate-args")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", str(CLIENT), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_usage_and_infrastructure_errors_exit_3(tmp_path: Path) -> None:
    assert run("--server", "http://x", cwd=tmp_path).returncode == 3  # missing flags: argparse would say 2
    token = tmp_path / "token"
    token.write_text("tt_1_abc\n")
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    common = ["--token-file", str(token), "--trace", str(trace), "--format", "azure"]
    # Nothing listens on port 9 (discard): the server cannot be reached.
    unreachable = run("--server", "http://127.0.0.1:9", *common, cwd=tmp_path)
    assert unreachable.returncode == 3 and "cannot reach" in unreachable.stderr
    missing = run(
        "--server", "http://127.0.0.1:9", *common, "--spec", str(tmp_path / "nope.yaml"), cwd=tmp_path
    )
    assert missing.returncode == 3 and "--spec" in missing.stderr
    bad = run("--server", "http://127.0.0.1:9", *common, "--candidate-args", "max_num_seqs", cwd=tmp_path)
    assert bad.returncode == 3 and "key=value" in bad.stderr


VERDICT = {
    "experiment": 7,
    "url": "https://tailtune.example/experiments/7/",
    "baseline": "B0",
    "candidate": "C1",
    "verdict": "regression",
    "exit_code": 1,
    "reasons": [],
    "cases": [
        {"class": "short", "metric": "ttft_p99_ms", "unit": "ms", "outcome": "fail", "b0": 80.0, "candidate": 410.0,
         "diff": 330.0, "ci": [250.0, None], "message": "materially worse than B0 at window/window <&>"},
        {"class": "short", "metric": "e2e_p99_ms", "unit": "ms", "outcome": "pass", "b0": 900.0, "candidate": 905.0,
         "diff": 5.0, "ci": [-20.0, 30.0], "message": None},
        {"class": "long", "metric": "ttft_p99_ms", "unit": "ms", "outcome": "skipped", "message": "not enough requests"},
    ],
}  # fmt: skip


def test_junit_has_one_case_per_class_and_metric_and_links_the_experiment() -> None:
    root = ET.fromstring(client.render_junit(VERDICT))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "1"
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    assert set(cases) == {("short", "ttft_p99_ms"), ("short", "e2e_p99_ms"), ("long", "ttft_p99_ms")}
    fail = cases[("short", "ttft_p99_ms")].find("failure")
    assert fail is not None and "B0 80 ms, candidate 410 ms" in (fail.get("message") or "")
    assert "+∞" in (fail.get("message") or "") and VERDICT["url"] in (fail.text or "")
    assert cases[("long", "ttft_p99_ms")].find("skipped") is not None
    inconclusive = {**VERDICT, "verdict": "inconclusive", "reasons": ["run C1 window/window/1 invalid: lag"]}
    errors = [
        c
        for c in ET.fromstring(client.render_junit(inconclusive)).iter("testcase")
        if c.find("error") is not None
    ]
    assert len(errors) == 1 and "lag" in (errors[0].find("error").get("message") or "")  # type: ignore[union-attr]


def test_markdown_summary() -> None:
    md = client.render_markdown(VERDICT)
    assert "regression" in md and "**FAIL**" in md and VERDICT["url"] in md
    assert "| short | ttft_p99_ms | 80 ms | 410 ms | +330 [+250, +∞] |" in md


def test_waiting_gives_up_with_exit_3_after_the_timeout() -> None:
    now = [0.0]
    said: list[str] = []

    def sleep(s: float) -> None:
        now[0] += s

    def fetch() -> dict:
        return {"verdict": "running", "experiment": 3, "progress": {"finished": 1, "total": 4}}

    with pytest.raises(client.GateError, match="no verdict within"):
        client.wait_for_verdict(
            fetch, timeout_s=30, poll_s=10, say=said.append, clock=lambda: now[0], sleep=sleep
        )
    assert said == ["running: 1/4 runs finished"]


def test_waiting_for_the_start_returns_the_gate_or_the_servers_refusal() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    answers = iter(
        [{"status": "queued"}, {"status": "importing"}, {"status": "done", "gate": {"experiment": 9}}]
    )
    gate = client.wait_for_start(
        lambda: next(answers), timeout_s=60, poll_s=2, clock=lambda: now[0], sleep=sleep
    )
    assert gate == {"experiment": 9} and now[0] == 4
    refused = {
        "status": "failed",
        "errors": [{"field": "trace", "message": "line 3: not a time"}, {"field": "host", "message": "none"}],
    }
    with pytest.raises(client.GateError, match="refused the gate: trace: line 3: not a time; host: none"):
        client.wait_for_start(lambda: refused, timeout_s=60, poll_s=2, clock=lambda: now[0], sleep=sleep)
    with pytest.raises(client.GateError, match="did not start within"):
        client.wait_for_start(
            lambda: {"status": "queued", "url": "/u/1"},
            timeout_s=5,
            poll_s=2,
            clock=lambda: now[0],
            sleep=sleep,
        )
