"""Write this directory's example results (deterministic; run from the repository root).

    .venv/bin/python examples/results/generate.py

Synthetic records in the exact results format (docs/ANALYSIS.md, "Results files"): for each
run key <cell>~<mixture>~<rate>~<repeat>, a run.json and a records.jsonl. The same arrivals
(the same trace hash) for both cells of a repeat, as a paired experiment has; C1 answers
the short class's first token about a quarter faster than B0. Three repeats of 180 s each: the
verdict tests the gain between whole runs too (docs/ANALYSIS.md, "The run is the unit"), and with
two repeats, or 60 s runs whose p95 rests on a few dozen requests, it cannot prove it.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from workers.replay.records import GapHistogram, RequestRecord

HERE = Path(__file__).resolve().parent
CLASSES = {"short": (64, 8, 0.8), "long": (1024, 8, 0.2)}
RATE_RPS, WARMUP_S, OBSERVATION_S = 2.0, 2.0, 180.0
TTFT_MS = {("B0", "short"): 80.0, ("C1", "short"): 60.0, ("B0", "long"): 400.0, ("C1", "long"): 410.0}


def arrivals(repeat: int) -> list[tuple[float, str]]:
    rng = random.Random(1000 + repeat)
    t, out = 0.0, []
    while t < WARMUP_S + OBSERVATION_S:
        t += rng.expovariate(RATE_RPS)
        if t < WARMUP_S + OBSERVATION_S:
            out.append((t, "short" if rng.random() < CLASSES["short"][2] else "long"))
    return out


def records(cell: str, repeat: int, run_id: str) -> list[RequestRecord]:
    rng = random.Random(f"{cell}-{repeat}")
    out = []
    for index, (t, cls) in enumerate(arrivals(repeat)):
        inp, outp, _ = CLASSES[cls]
        planned = round(t * 1e9)
        sent = planned + 200_000
        first = sent + round(TTFT_MS[(cell, cls)] * rng.lognormvariate(0, 0.25) * 1e6)
        gaps = GapHistogram()
        gap_ns = round(20e6 * rng.lognormvariate(0, 0.1))
        gaps.add(gap_ns / 1000, outp - 1)
        last = first + gap_ns * (outp - 1)
        out.append(
            RequestRecord(
                run_id=run_id, index=index, request_class=cls, warmup=t < WARMUP_S, input_tokens=inp,
                expected_output_tokens=outp, planned_ns=planned, sent_ns=sent, admission_delay_ns=0,
                first_token_ns=first, last_token_ns=last, end_ns=last + 1_000_000, output_tokens=outp,
                prompt_tokens=inp, chunks=outp, max_gap_ns=gap_ns, chunk_gaps=gaps, token_gaps=gaps,
                http_status=200, finish_reason="length",
            )
        )  # fmt: skip
    return out


def main() -> None:
    for repeat in (1, 2, 3):
        trace = hashlib.sha256(json.dumps(arrivals(repeat)).encode()).hexdigest()
        for cell in ("B0", "C1"):
            key = f"{cell}~80-20~near~{repeat}"
            run_dir = HERE / key
            run_dir.mkdir(exist_ok=True)
            run = {
                "status": "done",
                "trace_sha256": trace,
                "corpus_sha256": hashlib.sha256(b"example corpus").hexdigest(),
                "hardware_id": "cpu: example host",
                "model_revision": "tiny-llama-local-v1",
                "tokenizer_revision": "tiny-llama-local-v1",
                "vllm_version": "0.32.0",
                "dispatch_lag_p99_ms": 1.5,
            }
            (run_dir / "run.json").write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
            # The run id inside each record is the directory's key: results_import checks it matches.
            lines = [json.dumps(r.to_json(), sort_keys=True) for r in records(cell, repeat, key)]
            (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
