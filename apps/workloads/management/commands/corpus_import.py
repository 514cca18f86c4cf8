"""Store a prompt corpus file the team approves (JSONL of class + messages or prompt); prints its sha256.

Every text is redacted as ``--redact`` and ``--redact-pattern`` say before it is stored
(docs/TRACES.md, "Prompt corpora").
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.workloads.corpus_store import corpus_import
from apps.workloads.management.commands.trace_import import add_redaction_arguments, redaction_from


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--label", default="")
        add_redaction_arguments(parser)

    def handle(self, *args, **options):
        path = Path(options["file"])
        redact = redaction_from(options)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from None
        try:
            row = corpus_import(data=data, redact=redact, label=options["label"] or path.name)
        except ValueError as exc:  # names the line; nothing was saved
            raise CommandError(f"{path}: {exc}") from None
        self.stderr.write(
            json.dumps(
                {
                    "entries": row.entries,
                    "classes": row.meta.get("classes"),
                    "redaction": row.meta.get("redaction"),
                }
            )
        )
        self.stdout.write(row.sha256)
