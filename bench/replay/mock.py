"""One process of the benchmark's mock OpenAI server (run several with --reuse-port).

Serves until SIGTERM/SIGINT, then writes what it did for every request
(arrival, every token write, disconnects) to <log-dir>/mock-<name>.jsonl and
its own CPU time to <log-dir>/mock-<name>.cpu.json. Prints "ready <port>"
once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import uvloop

from tests.replay.mockserver import Behaviour, MockConfig, bind_socket, serve_forever


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="0")
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument("--itl", type=float, default=0.01)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--model", default="mock")
    args = parser.parse_args(argv)
    config = MockConfig(
        model=args.model,
        default=Behaviour(ttft_s=args.ttft, itl_s=args.itl, tokens_per_chunk=args.tokens_per_chunk),
        record_writes=True,
    )
    sock = bind_socket(port=args.port, reuse_port=True)

    async def run() -> list:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
        print(f"ready {args.port}", flush=True)
        inner = asyncio.create_task(serve_forever(config=config, sock=sock))
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            inner.cancel()
        return await inner

    log = uvloop.run(run())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = Path(args.log_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"mock-{args.name}.jsonl").open("w") as f:
        for entry in log:
            f.write(json.dumps(entry.to_json(), separators=(",", ":")) + "\n")
    (out / f"mock-{args.name}.cpu.json").write_text(
        json.dumps({"user_s": usage.ru_utime, "sys_s": usage.ru_stime})
    )


if __name__ == "__main__":
    main()
