"""Import a real trace file as a stored canonical trace; prints its trace_sha256.

An experiment then replays it with ``workload.arrival: {process: trace,
trace_sha256: <printed hash>}`` (docs/SPEC.md). ``--format openai-log`` reads a request log
in the OpenAI request format (docs/TRACES.md, "Request logs"): its prompts, redacted as
``--redact`` and ``--redact-pattern`` say, are stored as the trace's corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.experiments.model_roots import model_path_error
from apps.workloads.corpus_store import request_log_import
from apps.workloads.importers import FORMATS, parse_class_thresholds
from apps.workloads.redaction import RedactionError, Redactor, parse_rules, redactor
from apps.workloads.requestlog import FORMAT as REQUEST_LOG
from apps.workloads.services import tokenizer_dir, trace_import


def add_redaction_arguments(parser) -> None:
    parser.add_argument(
        "--redact",
        help="what is sensitive, replaced before anything is stored: a comma list of email, key, "
        "number, or none (required for request logs and corpora)",
    )
    parser.add_argument(
        "--redact-pattern",
        action="append",
        default=[],
        help="a regular expression whose matches are replaced by [REDACTED] (repeatable)",
    )


def redaction_from(options) -> Redactor:
    if options["redact"] is None:
        raise CommandError("--redact is required: name the rules (email,key,number) or say none")
    try:
        names = [] if options["redact"].strip() == "none" else parse_rules(options["redact"])
        return redactor(rules=names, patterns=options["redact_pattern"])
    except RedactionError as exc:
        raise CommandError(f"--redact: {exc}") from None


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--format", required=True, choices=sorted([*FORMATS, REQUEST_LOG]))
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
        add_redaction_arguments(parser)
        parser.add_argument(
            "--output-tokens",
            type=int,
            help="request logs: the output length of a request that logs none",
        )

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
        if options["format"] == REQUEST_LOG:
            self._request_log(path, data, thresholds, options)
            return
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

    def _request_log(self, path: Path, data: bytes, thresholds, options) -> None:
        redact = redaction_from(options)
        try:
            trace, corpus = request_log_import(
                data=data,
                model_dir=tokenizer_dir(options["model_dir"]),
                tokenizer_revision=options["tokenizer_revision"],
                thresholds=thresholds,
                max_model_len=options["max_model_len"],
                redact=redact,
                busiest_s=options["busiest"],
                window_start_s=options["window_start"],
                window_length_s=options["window_length"],
                speed=options["speed"],
                warmup_s=options["warmup"],
                default_output_tokens=options["output_tokens"],
                label=options["label"] or path.name,
            )
        except ValueError as exc:  # every error names its line; nothing was saved
            raise CommandError(f"{path}: {exc}") from None
        self.stderr.write(
            json.dumps(
                {
                    "requests": trace.requests,
                    "duration_s": trace.duration_s,
                    "corpus_sha256": corpus.sha256,
                    "classes": trace.meta.get("class_input_tokens"),
                    "redaction": trace.meta.get("redaction"),
                }
            )
        )
        self.stdout.write(trace.sha256)
