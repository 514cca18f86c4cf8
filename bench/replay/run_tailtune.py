"""Drive tailtune's replay at a constant rate (or in bursts) against a server; write records and a summary.

Used by compare.py as the "tailtune" client; also handy alone:
python bench/replay/run_tailtune.py --base-url http://127.0.0.1:18080 --rate 400 --duration 20 --out-dir /tmp/tt

The replay runs as a worker runs it: in a process of its own (``isolated``), its records
coming back over the child protocol; ``--in-process`` runs the loop in this process instead.
``--burst-size N --burst-every S`` plans N requests at the same instant every S seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from workers.replay.config import ReplayConfig
from workers.replay.run import run_replay


def constant_rate_requests(
    *,
    rate: float,
    duration_s: float,
    input_tokens: int,
    output_tokens: int,
    burst_size: int = 0,
    burst_every_s: float = 0.5,
) -> list[dict]:
    count = int(rate * duration_s)
    prompt = [(7 * i) % 1000 + 10 for i in range(input_tokens)]
    return [
        {
            "index": i,
            "t_offset_s": round((i // burst_size) * burst_every_s if burst_size else i / rate, 6),
            "class": "bench",
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "priority": 0,
            "warmup": False,
            "prompt_token_ids": prompt,
        }
        for i in range(count)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default="mock")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--drain", type=float, default=30.0)
    parser.add_argument("--tolerance-ms", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--in-process", action="store_true", help="run the send loop in this process")
    parser.add_argument("--burst-size", type=int, default=0, help="requests planned at each burst's instant")
    parser.add_argument("--burst-every", type=float, default=0.5, help="seconds between bursts")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    requests = constant_rate_requests(
        rate=args.rate,
        duration_s=args.duration,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        burst_size=args.burst_size,
        burst_every_s=args.burst_every,
    )
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter()
    config = ReplayConfig(
        base_url=args.base_url,
        model=args.model,
        run_id="bench",
        warmup_s=0.0,
        observation_s=args.duration,
        drain_deadline_s=args.drain,
        max_dispatch_lag_ms=args.tolerance_ms,
        processes=args.processes,
        isolated=not args.in_process,
    )
    result = run_replay(requests, config)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with (out / "records.jsonl").open("w") as f:
        for record in result.records:
            f.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
    summary = result.summary()
    summary.update({"client_cpu_s": cpu_s, "client_wall_s": wall})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "sent",
                    "ok",
                    "dispatch_lag_p50_ms",
                    "dispatch_lag_p99_ms",
                    "achieved_rate_rps",
                    "valid",
                    "client_cpu_s",
                )
            }
        )
    )


if __name__ == "__main__":
    main()
