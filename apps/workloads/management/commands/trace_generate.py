"""``manage.py trace_generate --spec FILE --mixture NAME --rate NAME --out FILE``.

Writes the canonical trace of one (mixture, rate, repeat) of a spec's
workload and prints its trace_sha256. Nothing touches the database.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.experiments.services import spec_limits
from apps.experiments.spec import SpecError, parse_spec
from apps.workloads.generate import GenerateError, generate_trace
from apps.workloads.prompts import PromptError
from apps.workloads.services import tokenizer_dir
from apps.workloads.tracefile import trace_dumps, trace_sha256


def _write_atomically(path: Path, data: bytes) -> None:
    # A reader never sees half a trace: write beside it, then rename.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Command(BaseCommand):
    help = "Generate one frozen trace from a spec and print its trace_sha256."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--spec", required=True, type=Path)
        parser.add_argument("--mixture", required=True)
        parser.add_argument("--rate", required=True)
        parser.add_argument("--repeat", type=int, default=1, help="1-based, as in the run plan")
        parser.add_argument("--seed", type=int, default=None, help="override workload.seed")
        parser.add_argument("--uniform", action="store_true", help="the constant-spacing companion")
        parser.add_argument("--out", required=True, type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        spec_path: Path = options["spec"]
        try:
            # The model is read here, so this machine's model roots are the ones that apply.
            spec = parse_spec(spec_path.read_text(), limits=spec_limits(local=True))
        except OSError as exc:
            raise CommandError(f"{spec_path}: {exc.strerror}") from None
        except SpecError as exc:
            raise CommandError(f"{spec_path}:\n{exc}") from None
        w = spec["workload"]
        mixture, rate = options["mixture"], options["rate"]
        if mixture not in w["mixtures"]:
            raise CommandError(f"--mixture {mixture!r}: the spec has {', '.join(w['mixtures'])}")
        if rate not in w["rates"]:
            raise CommandError(f"--rate {rate!r}: the spec has {', '.join(w['rates'])}")
        if options["repeat"] < 1 or options["repeat"] > w["repeats"]:
            raise CommandError(f"--repeat must be between 1 and workload.repeats ({w['repeats']})")
        try:
            trace = generate_trace(
                classes=spec["classes"],
                mixture_name=mixture,
                mixture=w["mixtures"][mixture],
                rate_name=rate,
                rate_rps=w["rates"][rate],
                arrival_process=w["arrival"]["process"],
                arrival_cv=w["arrival"].get("cv"),
                seed=w["seed"] if options["seed"] is None else options["seed"],
                repeat=options["repeat"],
                warmup_s=w["warmup_s"],
                observation_s=w["observation_s"],
                tokenizer_dir=tokenizer_dir(spec["model"]["path"]),
                tokenizer_revision=spec["model"]["tokenizer_revision"],
                uniform=options["uniform"],
            )
        except (GenerateError, PromptError) as exc:
            raise CommandError(str(exc)) from None
        data = trace_dumps(trace)
        _write_atomically(options["out"], data)
        self.stdout.write(trace_sha256(data))
