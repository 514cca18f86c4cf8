"""The CPU engine's start, with vLLM's AOT compile artifact and without it, side by side.

vLLM 0.32's CPU build compiles the model with torch.compile (Dynamo, then Inductor) at every
start. It saves an AOT artifact of that compile and tries to load it at the next start, but the
load fails on this build ("'function' object has no attribute 'finalize_loading'", in the
server log), so every start compiles again. With ``VLLM_USE_AOT_COMPILE=0`` vLLM keeps its
older cache: Dynamo traces the model again and the Inductor graphs are loaded from disk.

This starts the tiny model through the worker's own launcher (``EngineServer``) in alternating
order, vLLM's default (AOT compile on, set explicitly because the engine venv's sitecustomize
now defaults it off: scripts/engine-setup.sh) and ``VLLM_USE_AOT_COMPILE=0``, and records for
each start:

- the seconds until the server answered /health (what a run's ``start_s`` counts);
- vLLM's own "init engine (profile, create kv cache, warmup model)" seconds, from its log;
- whether the log shows a load failure, a load from the cache, or a fresh compile;
- the served speed after the start: eight requests one after another, 256 tokens each
  (``ignore_eos``), as the mean time per output token. Same compiled kernels should mean the
  same speed; a different one would change what the tests measure.

Run after `make engine`, with no other vLLM server on the machine:

    .venv/bin/python bench/engine/start_time.py [--rounds 3] [--arms A,B] [--out bench/results/start_time.md]

``--arms "VLLM_USE_AOT_COMPILE=0,enforce_eager"`` compares the compiled start with an eager one
(bench/results/start_time_eager.md).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.engine.common import ENGINE_DIR, MODEL, write_report  # noqa: E402
from workers.engine.launcher import HostConfig, cpu_engine_host  # noqa: E402
from workers.engine.server import EngineServer  # noqa: E402

# Explicit in both arms: the engine venv's sitecustomize defaults it to 0 (scripts/engine-setup.sh).
# Each arm: the server's extra environment and extra cell args ("enforce_eager": no compile, so no
# warm-up pass at the start).
ARMS: dict[str, tuple[dict[str, str], dict[str, object]]] = {
    "default": ({"VLLM_USE_AOT_COMPILE": "1"}, {}),
    "VLLM_USE_AOT_COMPILE=0": ({"VLLM_USE_AOT_COMPILE": "0"}, {}),
    "enforce_eager": ({"VLLM_USE_AOT_COMPILE": "0"}, {"enforce_eager": True}),
}
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")


def compile_path(log: str) -> str:
    if "load failure" in log:
        return "AOT load failed, compiled"
    if "Directly load" in log or "from the cache" in log:
        return "loaded from cache"
    return "compiled"


def served_ms_per_token(base_url: str) -> float:
    body = {"model": str(MODEL), "prompt": [7] * 32, "max_tokens": 256, "min_tokens": 256, "ignore_eos": True}
    per_token = []
    with httpx.Client(timeout=120) as client:
        client.post(base_url + "/v1/completions", json={**body, "max_tokens": 8, "min_tokens": 8})
        for _ in range(8):
            started = time.perf_counter()
            client.post(base_url + "/v1/completions", json=body).raise_for_status()
            per_token.append((time.perf_counter() - started) * 1000 / 256)
    return statistics.mean(per_token)


def one_start(arm: str, n: int) -> str:
    base = cpu_engine_host(ENGINE_DIR)
    env, extra_args = ARMS[arm]
    host = HostConfig(vllm_command=base.vllm_command, bind_host=base.bind_host, extra_env=env)
    log_path = Path(f"/tmp/start_time_{n}.log")
    log_path.unlink(missing_ok=True)
    server = EngineServer(
        model=str(MODEL),
        cell_args={"max_num_batched_tokens": 2048, "max_num_seqs": 8, **extra_args},
        controls={"dtype": "bfloat16", "max_model_len": 2048, "kv_cache_memory_bytes": 33554432},
        host=host,
        log_path=log_path,
        health_deadline_s=300,
        grace_s=15,
    )
    with server:
        started = time.monotonic()
        server.start()
        ready_s = time.monotonic() - started
        speed = served_ms_per_token(server.base_url)
    log = log_path.read_text(errors="replace")
    init = INIT.search(log)
    return (
        f"| {n} | {arm} | {ready_s:.1f} | {init.group(1) if init else '?'} | {compile_path(log)} | "
        f"{speed:.2f} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--arms",
        default="default,VLLM_USE_AOT_COMPILE=0",
        help=f"the two arms to alternate, comma-separated, from: {', '.join(ARMS)}",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    if len(arms) != 2 or not set(arms) <= set(ARMS):
        parser.error(f"--arms: two of {', '.join(ARMS)}")
    if args.dry_run:  # needs the CPU engine: the suite checks only this far
        print(f"dry run: {vars(args)}")
        return
    rows = []
    n = 0
    for round_ in range(args.rounds):
        # ABBA over rounds, so neither arm always goes first.
        order = arms if round_ % 2 == 0 else list(reversed(arms))
        for arm in order:
            n += 1
            rows.append(one_start(arm, n))
            print(rows[-1], flush=True)
    write_report(
        "CPU engine start",
        [
            "`.venv/bin/python bench/engine/start_time.py` on this 2-core host: the tiny model at",
            "`max_num_seqs: 8`, started through the worker's launcher, the two arms alternated.",
        ],
        ["start", "arm", "ready (s)", "vLLM init engine (s)", "compile", "served ms per output token"],
        rows,
        args.out,
    )


if __name__ == "__main__":
    main()
