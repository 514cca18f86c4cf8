from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from workers.replay.config import ReplayConfig
from workers.replay.records import RequestRecord
from workers.replay.request import ENDPOINTS
from workers.replay.run import run_replay
from workers.replay.summary import class_summary, format_table
from workers.replay.trace import TraceError, trace_read

# Used when neither the command line nor the trace header says otherwise.
DEFAULT_DRAIN_DEADLINE_S = 30.0
DEFAULT_TOLERANCE_MS = 5.0


class Command(BaseCommand):
    help = (
        "Replay a canonical trace against any OpenAI-compatible server (open loop, streaming), "
        "write one JSON record per request and print a per-class summary. Needs no database."
    )

    def add_arguments(self, parser):
        parser.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
        parser.add_argument("--model", required=True, help="model name the server serves")
        parser.add_argument("--trace", required=True, help="canonical trace file (JSONL)")
        parser.add_argument("--out", required=True, help="where to write the records (JSONL)")
        parser.add_argument(
            "--warmup",
            type=float,
            help="warm-up seconds (default: the trace header's meta.warmup_s); overrides the file's warmup flags",
        )
        parser.add_argument("--observation", type=float, help="observation seconds (default: from the trace)")
        parser.add_argument("--drain-deadline", type=float, help="seconds after the observation window")
        parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="completions")
        parser.add_argument(
            "--max-concurrency", type=int, help="client-side cap (waits reported as admission delay)"
        )
        parser.add_argument(
            "--tolerance-ms", type=float, help="p99 dispatch lag above which the run is invalid"
        )
        parser.add_argument(
            "--read-timeout", type=float, help="seconds without data before a stream is a timeout"
        )
        parser.add_argument("--sha256", help="expected sha256 of the trace file")
        parser.add_argument("--run-id", help="run id written into the records (default: a new uuid)")
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            help="spread the send loop over this many processes (high rates)",
        )

    def handle(self, *args, **options):
        try:
            trace = trace_read(path=options["trace"], expected_sha256=options["sha256"])
        except OSError as exc:
            raise CommandError(f"--trace: {exc}") from None
        except TraceError as exc:
            raise CommandError(str(exc)) from None
        if not trace.requests:
            raise CommandError(f"{options['trace']}: the trace holds no requests")
        meta = trace.meta
        requests: list[dict[str, Any]] = trace.requests
        warmup_s = _number(options["warmup"], meta.get("warmup_s"), 0.0)
        if options["warmup"] is not None:
            requests = [{**r, "warmup": r["t_offset_s"] < warmup_s} for r in requests]
        last_offset = requests[-1]["t_offset_s"]
        observation_s = _number(
            options["observation"], meta.get("observation_s"), max(0.001, last_offset - warmup_s)
        )
        drain_s = _number(options["drain_deadline"], meta.get("drain_deadline_s"), DEFAULT_DRAIN_DEADLINE_S)
        tolerance_ms = _number(options["tolerance_ms"], meta.get("max_dispatch_lag_ms"), DEFAULT_TOLERANCE_MS)
        for name, value in (
            ("--warmup", warmup_s),
            ("--observation", observation_s),
            ("--drain-deadline", drain_s),
        ):
            if value < 0:
                raise CommandError(f"{name} must be >= 0")
        if options["processes"] < 1:
            raise CommandError("--processes must be >= 1")
        run_id = options["run_id"] or str(uuid.uuid4())
        out_path = Path(options["out"])
        lock = threading.Lock()
        try:
            out = out_path.open("w", encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"--out: {exc}") from None

        def write(batch: list[RequestRecord]) -> None:
            with lock:
                for record in batch:
                    out.write(json.dumps(record.to_json(), sort_keys=True, separators=(",", ":")) + "\n")
                out.flush()

        self.stderr.write(
            f"replaying {len(requests)} requests ({trace.sha256[:12]}) to {options['base_url']}: "
            f"warm-up {warmup_s:g} s, observation {observation_s:g} s, drain {drain_s:g} s"
        )
        with out:
            config = ReplayConfig(
                base_url=options["base_url"],
                model=options["model"],
                run_id=run_id,
                warmup_s=warmup_s,
                observation_s=observation_s,
                drain_deadline_s=drain_s,
                max_dispatch_lag_ms=tolerance_ms,
                endpoint=options["endpoint"],
                max_concurrency=options["max_concurrency"],
                read_timeout_s=options["read_timeout"],
                processes=options["processes"],
                # In a process of its own, as a worker runs it: this one's file writes never
                # stall the send loop.
                isolated=True,
            )
            result = run_replay(requests, config, on_batch=write)
        lag = result.dispatch_lag_p99_ms
        self.stdout.write(
            f"run {run_id}: {result.sent}/{result.planned_requests} sent, {result.ok} ok, {result.errors} errors, "
            f"{result.cancelled} cancelled, {result.unfinished} unfinished, {result.not_sent} not sent"
        )
        rate = f"{result.achieved_rate_rps:.1f}" if result.achieved_rate_rps is not None else "-"
        planned = f"{result.planned_rate_rps:.1f}" if result.planned_rate_rps is not None else "-"
        self.stdout.write(
            f"dispatch lag p50 {_ms(result.dispatch_lag_p50_ms)} p99 {_ms(lag)} max {_ms(result.dispatch_lag_max_ms)}; "
            f"rate {rate}/{planned} req/s"
        )
        self.stdout.write("VALID" if result.valid else f"INVALID: {result.invalid_reason}")
        self.stdout.write(format_table(class_summary(result.records)))
        self.stdout.write(f"records: {out_path}")


def _number(given: float | None, from_meta: Any, default: float) -> float:
    if given is not None:
        return float(given)
    if isinstance(from_meta, int | float) and not isinstance(from_meta, bool):
        return float(from_meta)
    return default


def _ms(value: float | None) -> str:
    return f"{value:.2f} ms" if value is not None else "-"
