"""Benches cannot rot: every script under bench/ runs here at a tiny size (issue #38 item 5).

Each script is imported from its file and its ``main(argv)`` called in this process with the
size flags that make it a smoke run of about a second, and what it prints is checked for its
figures; the whole module is meant to stay well under a minute of one lane. Runs in ``make test``
and CI (no engine, browser or reference marker; nothing here skips).

Run for real, at their tiny size:
- bench/analysis/report_bench.py (``--smoke``: B0 and C1 on one mixture, 8 runs of 50 records,
  the report by phase, the naive peer);
- bench/ui/results_page_bench.py (``--smoke``: the same 8 runs analysed, each page loaded twice);
- bench/runs/ingest_bench.py (``--smoke``: 2,000 records once by each path);
- bench/analysis/aa_power.py, bench/analysis/gate_power.py (one set each, one process);
- bench/calibration/search_cost.py (``--capacities 20``);
- bench/replay/mock.py (a child process started, asked for one stream, stopped, its log read)
  with bench/replay/run_tailtune.py replaying one second against it (``--in-process``);
- bench/replay/report.py on the recorded bench/results/replay-raw.json;
- bench/engine/common.py's report writer;
- bench/search/run.py (one seed, six trials, against its grid).

Need the vLLM engine (or, for compare.py, the peer clients' virtualenvs; for upload_memory.py a
service of its own whose migrations alone take tens of seconds): checked by their ``--dry-run``
(imports, argument parsing) and their pure functions only, each test named ``..._dry_run``:
bench/analysis/record_aa.py, bench/engine/lifecycle.py, send_priority.py, start_time.py,
bench/engine_time/run.py, bench/calibration/probe_engine_time.py, bench/ui/results_page_paint.py
(a browser), bench/faults/faults.py, bench/replay/compare.py,
bench/upload/upload_memory.py; bench/replay/vllm_cli.py is compiled only (it imports vLLM), and
bench/replay/run_rates_and_bursts.sh is parsed by ``bash -n``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

pytestmark = pytest.mark.bench


def script(relative: str) -> ModuleType:
    """The bench script as a module (each is a file, not a package member)."""
    path = BENCH / relative
    name = "bench_" + relative.replace("/", "_").removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_every_bench_script_is_covered_here():
    source = Path(__file__).read_text()
    scripts = sorted(str(p.relative_to(BENCH)) for p in BENCH.rglob("*") if p.suffix in (".py", ".sh"))
    assert scripts and [s for s in scripts if s not in source] == []


@pytest.mark.django_db
def test_report_bench(capsys):
    results = script("analysis/report_bench.py").main(["--smoke", "--no-migrate"])
    out = capsys.readouterr().out
    assert "runs: 8, records: 400" in out and "decision: " in out and "comparisons: " in out
    assert results["experiment_report_build (total)"] > 0
    assert "ratio naive / experiment_report_build" in out and "peak RSS" in out


@pytest.mark.django_db
def test_results_page_bench(capsys):
    script("ui/results_page_bench.py").main(["--smoke"])
    out = capsys.readouterr().out
    assert "results page" in out and "p95 ms" in out and "8 runs" in out


@pytest.mark.django_db
def test_ingest_bench(capsys):
    rates = script("runs/ingest_bench.py").main(["--smoke", "--no-migrate"])
    out = capsys.readouterr().out
    assert "2,000 records in batches of 1,000" in out and "records_ingest:" in out
    assert rates["records_ingest"] > 0


def test_aa_power(capsys):
    script("analysis/aa_power.py").main(
        ["--sets", "1", "--extra-sets", "0", "--ab-sets", "0", "--verify-sets", "0", "--ab10-sets", "0"]
        + ["--processes", "1", "--only", "aa"]
    )
    assert "A/A, run sigma 0" in capsys.readouterr().out


def test_gate_power(capsys):
    script("analysis/gate_power.py").main(
        ["--sets", "1", "--power-sets", "0", "--only", "aa_h0", "--processes", "1"]
    )
    out = capsys.readouterr().out
    assert "unchanged, run sigma 0" in out and "1 sets in" in out


def test_search_cost(capsys):
    script("calibration/search_cost.py").main(["--capacities", "20"])
    out = capsys.readouterr().out
    assert "20 capacities" in out and "x the engine runs" in out


def test_mock_and_run_tailtune(tmp_path, capsys):
    """A one-process mock, one second of constant-rate replay against it in this process."""
    port_probe = script("replay/compare.py").free_port()
    log_dir = tmp_path / "mock"
    log_dir.mkdir()
    mock = subprocess.Popen(
        [sys.executable, str(BENCH / "replay/mock.py"), "--port", str(port_probe), "--log-dir", str(log_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert mock.stdout is not None and mock.stdout.readline().startswith("ready")
        out_dir = tmp_path / "replay"
        script("replay/run_tailtune.py").main(
            [
                "--base-url",
                f"http://127.0.0.1:{port_probe}",
                "--rate",
                "10",
                "--duration",
                "1",
                "--drain",
                "5",
            ]
            + ["--output-tokens", "4", "--in-process", "--out-dir", str(out_dir)]
        )
    finally:
        mock.send_signal(signal.SIGTERM)
        mock.wait(timeout=10)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary and (log_dir / "mock-0.jsonl").read_text().count("\n") >= 5  # ten requests planned


def test_replay_report():
    rendered = script("replay/report.py").render(
        script("replay/report.py").load([str(BENCH / "results/replay-raw.json")])
    )
    assert "|" in rendered and "tailtune" in rendered


def test_engine_common_report(tmp_path):
    text = script("engine/common.py").write_report(
        "t", ["intro"], ["a", "b"], ["| 1 | 2 |"], tmp_path / "r.md"
    )
    assert (tmp_path / "r.md").read_text() == text and "| a | b |" in text


def test_record_aa_dry_run(capsys):
    record_aa = script("analysis/record_aa.py")
    record_aa.main(["--dry-run"])
    assert "dry run" in capsys.readouterr().out
    doc = record_aa.spec(name="aa", repeats=2, rate=1.0, observation_s=10)
    assert doc["workload"]["repeats"] == 2


@pytest.mark.parametrize(
    "relative, argv",
    [
        ("engine/lifecycle.py", []),
        ("engine/send_priority.py", []),
        ("engine/start_time.py", []),
        ("engine_time/run.py", []),
        ("calibration/probe_engine_time.py", []),
        ("ui/results_page_paint.py", []),
        ("faults/faults.py", ["kills"]),
        ("replay/compare.py", ["--out", "unused.json"]),
        ("upload/upload_memory.py", []),
    ],
)
def test_engine_scripts_dry_run(relative, argv, capsys):
    script(relative).main([*argv, "--dry-run"])
    assert capsys.readouterr().out.startswith("dry run: ")


def test_pure_parts_of_the_engine_scripts_dry_run(tmp_path):
    start_time = script("engine/start_time.py")
    assert start_time.compile_path("... AOT load failure ...") == "AOT load failed, compiled"
    assert start_time.compile_path("nothing of note") == "compiled"
    compare = script("replay/compare.py")
    assert compare.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert compare.planned_offset_ns(10, 5.0) == pytest.approx(2e9)
    upload = script("upload/upload_memory.py")
    rows = upload.write_trace(tmp_path / "t.csv", 20_000)
    assert rows >= 10_000 and (tmp_path / "t.csv").stat().st_size >= 20_000
    assert upload.vm_hwm_kib(os.getpid()) > 0


def test_vllm_cli_and_the_shell_script_dry_run():
    py_compile.compile(str(BENCH / "replay/vllm_cli.py"), doraise=True)
    subprocess.run(["bash", "-n", str(BENCH / "replay/run_rates_and_bursts.sh")], check=True)


def test_search_bench(capsys):
    assert script("search/run.py").main(["--seeds", "1", "--max-trials", "6"]) in (0, None)
    out = capsys.readouterr().out
    assert "| seed | trials |" in out and "cost/grid" in out
