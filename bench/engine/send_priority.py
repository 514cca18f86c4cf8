"""The send loop's scheduling class against an engine that saturates the host, side by side.

The gate's starved candidate (``max_num_seqs: 1``) under the gate test's traffic window as it
was when this was measured (40 s of the shipped Azure conversation trace from 208 s, every
request, ~5.6 req/s, sizes capped to the 2,048-token context as the importer caps them; the test
now replays the first 20 s) keeps the CPU engine busy through the whole run. This replays that
window through the worker's path (a child process, ``ReplayConfig(isolated=True)``) in
alternating order, the child in the normal class (``TAILTUNE_REPLAY_REALTIME=0``) and in the
real-time class, against one server, and records:

- the replay's own p99 dispatch lag and longest loop stall;
- two independent probes running beside it for the whole bench, each sleeping 20 ms in a loop
  and recording the longest oversleep: one in the normal class, one SCHED_FIFO. They are not
  tailtune code, so they say whether the host itself starved normal-class threads.

Run after `make engine`, with no other vLLM server on the machine (needs CAP_SYS_NICE, as root
on the CI host):

    .venv/bin/python bench/engine/send_priority.py [--rounds 2] [--out bench/results/send_priority.md]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.engine.common import ENGINE_DIR, MODEL, write_report  # noqa: E402
from workers.engine.launcher import cpu_engine_host  # noqa: E402
from workers.engine.server import EngineServer  # noqa: E402
from workers.replay.config import ReplayConfig  # noqa: E402
from workers.replay.run import run_replay  # noqa: E402
from workers.replay.runtime import REALTIME_ENV  # noqa: E402

TRACE = REPO / "examples" / "traces" / "AzureLLMInferenceTrace_conv.csv"
CONTEXT = 2048
PROBE = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
worst = 0.0
last = time.monotonic()
while time.monotonic() < end:
    time.sleep(0.02)
    now = time.monotonic()
    worst = max(worst, now - last - 0.02)
    last = now
print(round(worst * 1000, 1))
"""


def window() -> list[dict]:
    with TRACE.open(newline="") as f:
        rows = list(csv.reader(f))[1:]
    t0 = datetime.datetime.fromisoformat(rows[0][0][:26])
    requests = []
    for row in rows:
        at = (datetime.datetime.fromisoformat(row[0][:26]) - t0).total_seconds()
        if 208 <= at < 248:
            out = min(int(row[2]), CONTEXT - 1)
            inp = max(1, min(int(row[1]), CONTEXT - out))
            offset = len(requests) * 13
            ids = [10 + (offset + i) % 2000 for i in range(inp)]
            requests.append({"t_offset_s": at - 208, "prompt_token_ids": ids, "output_tokens": max(1, out)})
    return requests


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    args = parser.parse_args(argv)
    if args.dry_run:  # needs the CPU engine: the suite checks only this far
        print(f"dry run: {vars(args)}")
        return
    requests = window()
    server = EngineServer(
        model=str(MODEL),
        cell_args={"max_num_batched_tokens": 2048, "max_num_seqs": 1},
        controls={"dtype": "bfloat16", "max_model_len": CONTEXT, "kv_cache_memory_bytes": 33554432},
        host=cpu_engine_host(ENGINE_DIR),
        log_path=Path("/tmp/send_priority_engine.log"),
        health_deadline_s=240,
        grace_s=15,
    )
    rows = []
    with server:
        server.start()
        for round_ in range(args.rounds):
            # ABBA over rounds: normal first in even rounds, real-time first in odd ones.
            order = ["0", "1"] if round_ % 2 == 0 else ["1", "0"]
            for realtime in order:
                os.environ[REALTIME_ENV] = realtime
                span = 110.0
                probes = [
                    subprocess.Popen(
                        [sys.executable, "-c", PROBE, str(span)], stdout=subprocess.PIPE, text=True
                    ),
                    subprocess.Popen(
                        ["chrt", "-f", "1", sys.executable, "-c", PROBE, str(span)],
                        stdout=subprocess.PIPE,
                        text=True,
                    ),
                ]
                started = time.monotonic()
                config = ReplayConfig(
                    base_url=server.base_url,
                    model=str(MODEL),
                    run_id=f"bench-{round_}-{realtime}",
                    warmup_s=2,
                    observation_s=40,
                    drain_deadline_s=60,
                    max_dispatch_lag_ms=5000,
                    isolated=True,
                )
                result = run_replay(requests, config)
                # Let the server drain before the next arm, with the probes still watching.
                while time.monotonic() - started < span:
                    time.sleep(1)
                worst = [p.communicate()[0].strip() for p in probes]
                ok = sum(1 for r in result.records if r.ok)
                rows.append(
                    f"| {round_ + 1} | {result.send_priority} | {result.dispatch_lag_p99_ms:.1f} | "
                    f"{result.loop_stall_max_ms:.1f} | {worst[0]} | {worst[1]} | {ok}/{len(requests)} |"
                )
                print(rows[-1], flush=True)
    write_report(
        "send loop scheduling class",
        [
            "`.venv/bin/python bench/engine/send_priority.py` on this 2-core host: the CPU engine with",
            "`max_num_seqs: 1` under the gate test's former 40 s window (every request, ~5.6 req/s);",
            "probe columns are the longest oversleep of a 20 ms sleep in an independent process during",
            "that arm.",
        ],
        [
            "round",
            "send loop class",
            "replay p99 dispatch lag (ms)",
            "replay longest loop stall (ms)",
            "normal-class probe (ms)",
            "SCHED_FIFO probe (ms)",
            "requests ok",
        ],
        rows,
        args.out,
    )


if __name__ == "__main__":
    main()
