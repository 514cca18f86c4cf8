"""``manage.py trace_stats FILE --format F``: one JSON object of trace statistics."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.workloads.importers import DEFAULT_MAX_BYTES, FORMATS, TraceImportError, read_trace_file
from apps.workloads.stats import trace_file_stats, trace_stats
from apps.workloads.tracefile import TraceFormatError, trace_loads


class Command(BaseCommand):
    help = "Print the statistics of a trace file (definitions in docs/TRACES.md) as one JSON object."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--format", required=True, choices=[*FORMATS, "tailtune"], dest="fmt")
        parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="refuse larger files")
        parser.add_argument(
            "--sec-multiplier", type=float, default=1.0, help="vllm-timed: seconds per timestamp unit"
        )
        parser.add_argument(
            "--block-tokens", type=int, default=16, help="vllm-timed: tokens per hash_ids block"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        fmt: str = options["fmt"]
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        try:
            if fmt == "tailtune":
                size = os.stat(path).st_size
                if size > options["max_bytes"]:
                    raise CommandError(f"{path} is {size} bytes, over the {options['max_bytes']}-byte limit")
                result = trace_file_stats(trace_loads(path.read_bytes()))
            else:
                extra = {}
                if fmt == "vllm-timed":
                    extra = {
                        "sec_multiplier": options["sec_multiplier"],
                        "block_tokens": options["block_tokens"],
                    }
                imported = read_trace_file(path, fmt=fmt, max_bytes=options["max_bytes"], **extra)
                for message in imported.repairs + imported.notes:
                    self.stderr.write(f"{path}: {message}")
                result = trace_stats(imported.t_s, imported.input_tokens, imported.output_tokens)
        except (TraceImportError, TraceFormatError) as exc:
            raise CommandError(f"{path}: {exc}") from None
        self.stdout.write(json.dumps(result))
