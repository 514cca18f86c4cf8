"""Import a real trace file as a stored canonical trace; prints its trace_sha256.

An experiment then replays it with ``workload.arrival: {process: trace,
trace_sha256: <printed hash>}`` (docs/SPEC.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.workloads.importers import FORMATS
from apps.workloads.services import tokenizer_dir, trace_import


def _thresholds(text: str) -> list[tuple[str, int | None]]:
    """``short:1024,long`` -> [("short", 1024), ("long", None)]: the last class takes the rest."""
    out: list[tuple[str, int | None]] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        name, _, limit = part.partition(":")
        if not name:
            raise CommandError(f"--classes item {i + 1}: a class name is required")
        if limit:
            try:
                out.append((name, int(limit)))
            except ValueError:
                raise CommandError(f"--classes item {i + 1}: {limit!r} is not a token count") from None
        else:
            out.append((name, None))
    if not out or out[-1][1] is not None:
        raise CommandError("--classes: the last class must have no limit (it takes every longer input)")
    return out


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("file")
        parser.add_argument("--format", required=True, choices=sorted(FORMATS))
        parser.add_argument(
            "--model-dir", required=True, help="model directory whose tokenizer builds the prompts"
        )
        parser.add_argument("--tokenizer-revision", required=True)
        parser.add_argument("--max-model-len", type=int, required=True)
        parser.add_argument(
            "--classes",
            default="short:1024,long",
            help="class by input length, e.g. short:1024,long (default)",
        )
        parser.add_argument("--busiest", type=float, help="keep the busiest N seconds")
        parser.add_argument("--window-start", type=float)
        parser.add_argument("--window-length", type=float)
        parser.add_argument("--speed", type=float, default=1.0, help="replay at k x speed")
        parser.add_argument("--warmup", type=float, default=0.0, help="seconds at the start marked warm-up")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--label", default="")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        path = Path(options["file"])
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from None
        try:
            row = trace_import(
                data=data,
                fmt=options["format"],
                tokenizer_dir=tokenizer_dir(options["model_dir"]),
                tokenizer_revision=options["tokenizer_revision"],
                thresholds=_thresholds(options["classes"]),
                max_model_len=options["max_model_len"],
                busiest_s=options["busiest"],
                window_start_s=options["window_start"],
                window_length_s=options["window_length"],
                speed=options["speed"],
                warmup_s=options["warmup"],
                seed=options["seed"],
                label=options["label"] or path.name,
            )
        except ValueError as exc:  # every importer error names its line; nothing was saved
            raise CommandError(f"{path}: {exc}") from None
        self.stderr.write(
            json.dumps({"requests": row.requests, "duration_s": row.duration_s, "stats": row.stats})
        )
        self.stdout.write(row.sha256)
