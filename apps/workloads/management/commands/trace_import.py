"""Import a real trace file as a stored canonical trace; prints its trace_sha256.

An experiment then replays it with ``workload.arrival: {process: trace,
trace_sha256: <printed hash>}`` (docs/SPEC.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.experiments.model_roots import model_path_error
from apps.workloads.importers import FORMATS, parse_class_thresholds
from apps.workloads.services import tokenizer_dir, trace_import


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
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

    def handle(self, *args, **options):
        path = Path(options["file"])
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from None
        try:
            thresholds = parse_class_thresholds(options["classes"])
        except ValueError as exc:
            raise CommandError(f"--{exc}") from None
        outside = model_path_error(options["model_dir"])
        if outside is not None:
            raise CommandError(f"--model-dir: {outside}")
        try:
            row = trace_import(
                data=data,
                fmt=options["format"],
                tokenizer_dir=tokenizer_dir(options["model_dir"]),
                tokenizer_revision=options["tokenizer_revision"],
                thresholds=thresholds,
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
