"""Load request records and metric samples of an experiment's runs from JSONL files.

Layout (docs/ANALYSIS.md, "Results files"): DIR/<run_id>/records.jsonl and,
optionally, DIR/<run_id>/metrics.jsonl, where <run_id> is the run's UUID.
Strict: the first bad line stops the import with its file and line number,
and nothing is saved (one transaction). Re-importing the same files changes
nothing: records are upserted on (run, index), and a run's metric samples
are replaced by those of its metrics.jsonl.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from apps.experiments.models import Experiment
from apps.runs.models import MetricSample, Run
from apps.runs.models import RequestRecord as RecordRow
from workers.replay.records import RequestRecord

BATCH = 5_000
_INT = "int"
_OPT_INT = "int or null"
_STR = "string"
_OPT_STR = "string or null"
_BOOL = "boolean"
_HIST = "histogram object"
RECORD_TYPES: dict[str, str] = {
    "run_id": _STR, "index": _INT, "request_class": _STR, "warmup": _BOOL, "input_tokens": _INT,
    "expected_output_tokens": _INT, "planned_ns": _INT, "sent_ns": _OPT_INT, "admission_delay_ns": _OPT_INT,
    "first_token_ns": _OPT_INT, "last_token_ns": _OPT_INT, "end_ns": _OPT_INT, "output_tokens": _OPT_INT,
    "prompt_tokens": _OPT_INT, "chunks": _INT, "max_gap_ns": _OPT_INT, "chunk_gaps": _HIST,
    "token_gaps": _HIST, "http_status": _OPT_INT, "error_kind": _OPT_STR, "error": _OPT_STR,
    "finish_reason": _OPT_STR, "cancelled": _BOOL, "unfinished": _BOOL, "sent": _BOOL, "priority": _INT,
    "cut": _BOOL, "backend": _STR,
}  # fmt: skip
REQUIRED = (
    "run_id",
    "index",
    "request_class",
    "warmup",
    "input_tokens",
    "expected_output_tokens",
    "planned_ns",
)
SAMPLE_TYPES: dict[str, str] = {
    "t_ns": _INT, "phase": _STR, "epoch": _INT, "name": _STR, "kind": _STR, "value": "number or null",
    "labels": "object", "histogram": "object or null", "taken_at": "ISO datetime", "server": _STR,
}  # fmt: skip
SAMPLE_REQUIRED = ("t_ns", "phase", "name", "kind")
RECORD_UPDATE_FIELDS = [f for f in RECORD_TYPES if f not in ("run_id", "index")]


def _ok(kind: str, v: Any) -> bool:
    is_int = isinstance(v, int) and not isinstance(v, bool)
    if kind == _INT:
        return is_int
    if kind == _OPT_INT:
        return v is None or is_int
    if kind == _STR:
        return isinstance(v, str)
    if kind == _OPT_STR:
        return v is None or isinstance(v, str)
    if kind == _BOOL:
        return isinstance(v, bool)
    if kind == _HIST:
        return isinstance(v, dict) and all(
            isinstance(k, str) and k.isdigit() and isinstance(c, (int, float)) and not isinstance(c, bool)
            for k, c in v.items()
        )
    if kind == "number or null":
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
    if kind == "object":
        return isinstance(v, dict)
    if kind == "object or null":
        return v is None or isinstance(v, dict)
    return True


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CommandError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise CommandError(f"{path}:{number}: expected a JSON object")
            yield number, obj


def _check(
    path: Path, number: int, obj: dict[str, Any], types: dict[str, str], required: tuple[str, ...]
) -> None:
    where = f"{path}:{number}"
    unknown = sorted(set(obj) - set(types))
    if unknown:
        raise CommandError(f"{where}: unknown field(s) {', '.join(unknown)}")
    for name in required:
        if name not in obj:
            raise CommandError(f"{where}: missing field {name}")
    for name, value in obj.items():
        if not _ok(types[name], value):
            raise CommandError(f"{where}: field {name} must be {types[name]}, got {value!r:.60}")


class Command(BaseCommand):
    help = "Import request records and metric samples for an experiment's runs from DIR/<run_id>/*.jsonl."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--experiment", type=int, required=True)
        parser.add_argument("directory", type=Path)

    def handle(self, *args: Any, **opts: Any) -> None:
        directory: Path = opts["directory"]
        try:
            experiment = Experiment.objects.get(pk=opts["experiment"])
        except Experiment.DoesNotExist:
            raise CommandError(f"experiment {opts['experiment']} does not exist") from None
        if not directory.is_dir():
            raise CommandError(f"{directory} is not a directory")
        runs = {str(r.run_id): r for r in experiment.runs.all()}
        classes = set(experiment.classes.values_list("name", flat=True))
        entries = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
        for p in entries:
            if not p.is_dir():
                raise CommandError(f"{p}: expected one directory per run, named by the run's UUID")
            try:
                uuid.UUID(p.name)
            except ValueError:
                raise CommandError(f"{p}: directory name is not a run UUID") from None
            if p.name not in runs:
                raise CommandError(f"{p}: run {p.name} is not a run of experiment {experiment.pk}")
            if not (p / "records.jsonl").is_file() and not (p / "metrics.jsonl").is_file():
                raise CommandError(f"{p}: has neither records.jsonl nor metrics.jsonl")
        totals = {"runs": 0, "records": 0, "samples": 0}
        with transaction.atomic():
            for p in entries:
                run = runs[p.name]
                totals["runs"] += 1
                if (p / "records.jsonl").is_file():
                    totals["records"] += self._records(p / "records.jsonl", run, classes)
                if (p / "metrics.jsonl").is_file():
                    totals["samples"] += self._samples(p / "metrics.jsonl", run)
        self.stdout.write(
            f"imported {totals['records']} records and {totals['samples']} metric samples "
            f"for {totals['runs']} runs of experiment {experiment.pk}"
        )

    def _records(self, path: Path, run: Run, classes: set[str]) -> int:
        seen: set[int] = set()
        batch: list[RecordRow] = []
        count = 0
        for number, obj in _lines(path):
            _check(path, number, obj, RECORD_TYPES, REQUIRED)
            where = f"{path}:{number}"
            if obj["run_id"] != str(run.run_id):
                raise CommandError(f"{where}: run_id {obj['run_id']!r} does not match the directory's run")
            if obj["index"] < 0:
                raise CommandError(f"{where}: field index must not be negative")
            if obj["index"] in seen:
                raise CommandError(f"{where}: index {obj['index']} appears twice")
            seen.add(obj["index"])
            if obj["request_class"] not in classes:
                raise CommandError(
                    f"{where}: request_class {obj['request_class']!r} is not a class of the experiment"
                )
            rec = RequestRecord.from_json(obj)
            fields = rec.to_json()
            fields.pop("run_id")
            batch.append(RecordRow(run=run, **fields))
            count += 1
            if len(batch) >= BATCH:
                self._flush(batch)
        self._flush(batch)
        return count

    @staticmethod
    def _flush(batch: list[RecordRow]) -> None:
        if batch:
            RecordRow.objects.bulk_create(
                batch,
                batch_size=BATCH,
                update_conflicts=True,
                unique_fields=["run", "index"],
                update_fields=RECORD_UPDATE_FIELDS,
            )
            batch.clear()

    def _samples(self, path: Path, run: Run) -> int:
        MetricSample.objects.filter(run=run).delete()
        batch: list[MetricSample] = []
        count = 0
        for number, obj in _lines(path):
            _check(path, number, obj, SAMPLE_TYPES, SAMPLE_REQUIRED)
            fields = dict(obj)
            if "taken_at" in fields:
                try:
                    taken = datetime.fromisoformat(fields["taken_at"])
                except (TypeError, ValueError):
                    raise CommandError(f"{path}:{number}: field taken_at must be an ISO datetime") from None
                if timezone.is_naive(taken):
                    raise CommandError(f"{path}:{number}: field taken_at needs a time zone")
                fields["taken_at"] = taken
            if fields.get("server", "") not in ("", "b0"):
                raise CommandError(f'{path}:{number}: field server must be "" (the run\'s server) or "b0"')
            if fields.get("epoch", 0) < 0:
                raise CommandError(f"{path}:{number}: field epoch must not be negative")
            fields.setdefault("labels", {})
            batch.append(MetricSample(run=run, **fields))
            count += 1
            if len(batch) >= BATCH:
                MetricSample.objects.bulk_create(batch, batch_size=BATCH)
                batch.clear()
        if batch:
            MetricSample.objects.bulk_create(batch, batch_size=BATCH)
        return count
