"""Time one CPU engine lifecycle: start to healthy, confirm, warm-up, a preempting burst, stop.

Run after `make engine`, with no other vLLM server on the machine:

    .venv/bin/python bench/engine/lifecycle.py [--out bench/results/engine-lifecycle.txt]

Prints (and writes) one line per phase with its wall time, plus the counter
deltas the scraper saw. The numbers depend on the machine's load and on
vLLM's compile cache (~/.cache/vllm): the first start of a new token budget
compiles, later ones reuse it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from workers.engine import procs  # noqa: E402
from workers.engine.launcher import cpu_engine_host  # noqa: E402
from workers.engine.scrape import Scraper, counter_delta  # noqa: E402
from workers.engine.server import EngineServer  # noqa: E402

CONTROLS = {
    "dtype": "bfloat16",
    "max_model_len": 4096,
    "kv_cache_memory_bytes": 6 * 1024 * 1024,
    "enable_prefix_caching": False,
    "seed": 0,
    "revision": "tiny-llama-local-v1",
    "tokenizer_revision": "tiny-llama-local-v1",
    "served_model_name": "tiny",
}


def complete(base_url: str, prompt_len: int, max_tokens: int, offset: int) -> int:
    body = {
        "model": "tiny",
        "prompt": [10 + (offset + i) % 2000 for i in range(prompt_len)],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    response = httpx.post(base_url + "/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="parse the arguments, say what would run and stop (the smoke test; needs no engine)",
    )
    args = parser.parse_args(argv)
    if args.dry_run:  # needs the CPU engine: the suite checks only this far
        print(f"dry run: {vars(args)}")
        return 0
    lines = [f"# engine lifecycle, {datetime.now(UTC).isoformat(timespec='seconds')}, {platform.node()}"]

    def note(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    engine = REPO / ".engine"
    server = EngineServer(
        model=str(engine / "models" / "tiny-llama"),
        cell_args={"max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": 8},
        controls=CONTROLS,
        host=cpu_engine_host(engine),
        log_path=Path("/tmp/tailtune-bench-engine.log"),
    )
    with server:
        t = time.perf_counter()
        server.start()
        note(f"start_to_healthy_s {time.perf_counter() - t:.1f}")
        t = time.perf_counter()
        facts = server.confirm()
        note(f"confirm_s {time.perf_counter() - t:.2f}")
        note(f"hardware_id {facts.hardware_id}")
        note(f"effective max_num_batched_tokens {facts.effective_args['max_num_batched_tokens']}")
        t = time.perf_counter()
        server.warm_up(n=4)
        note(f"warm_up_4_s {time.perf_counter() - t:.2f}")
        with Scraper(server.base_url, interval_s=1.0) as scraper:
            scraper.scrape("before")
            scraper.start_during()
            t = time.perf_counter()
            with ThreadPoolExecutor(6) as pool:
                tokens = sum(pool.map(lambda i: complete(server.base_url, 1500, 800, i * 7), range(6)))
            note(f"burst_6x1500in_800out_s {time.perf_counter() - t:.1f} ({tokens} tokens)")
            scraper.stop_during()
            scraper.scrape("after")
        for name in (
            "vllm:num_preemptions_total",
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
        ):
            note(f"delta {name} {counter_delta(scraper.samples, name)}")
        note(f"samples {len(scraper.samples)} scrape_errors {len(scraper.errors)}")
        t = time.perf_counter()
        code = server.stop()
        note(f"stop_s {time.perf_counter() - t:.2f} exit_status {code}")
        note(f"leftover_pids {json.dumps(procs.alive_pids(server.tracked_pids()))}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
