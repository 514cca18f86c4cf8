"""Load an experiment's runs, their request records and metric samples, and reach a decision.

Layout (docs/ANALYSIS.md, "Results files"; a complete example in examples/results/):
one directory per run, named by the run's UUID or by its key
``<cell>~<mixture>~<rate>~<repeat>`` (e.g. ``B0~80-20~near~1``), holding

- ``run.json``: what the analysis needs of the run (status, trace and corpus
  hashes, hardware id, revisions, dispatch lag), applied to the run's row; it may be a
  whole exported run record, in the method's names or the older ones (``cell``,
  ``window``), whose identity and windows must then be the directory's run's;
- ``records.jsonl``: one RequestRecord object per line;
- ``metrics.jsonl`` (optional): one metric sample per line.

Strict: the first bad line or field stops the import with its file and line
number, and nothing is saved (one transaction). Importing the same files again
before the analysis changes nothing: records are upserted on (run, index), and a
run's metric samples are replaced by those of its metrics.jsonl. An experiment
that takes no more records is refused (analysed, approved, rejected or revoked:
Experiment.assert_accepts_runs): the evidence a decision is made on never changes.

Afterwards, when every sweep run is finished with its hashes and hardware id,
the experiment is analysed and the decision printed; otherwise the command
names, per run, what is missing.
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

from apps.experiments.models import Experiment, RunsRefused
from apps.lifecycle.transition import experiment_transition
from apps.runs.models import MetricSample, Run
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.record_names import WINDOW_ALIAS, AliasConflict, resolve_aliases, windows
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
    "cut": _BOOL, "backend": _STR, "server_queue_ns": _OPT_INT, "server_prefill_ns": _OPT_INT,
    "server_decode_ns": _OPT_INT, "server_ttft_ns": _OPT_INT, "server_e2e_ns": _OPT_INT,
    "server_arrival_ns": _OPT_INT, "server_first_token_ns": _OPT_INT,
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
_NUM = "number"
_OPT_NUM = "number or null"
_ANY = "any value"
_WINDOW = "an object of warmup_s, observation_s and drain_deadline_s (numbers)"
# run.json may be a whole run record as tailtune exports it (docs/SPEC.md "The run record"), in
# the method's names or the older ones (cell, window: apps/runs/record_names.py). What the run
# measured and ran under is applied to the run's row:
RUN_TYPES: dict[str, str] = {
    "status": _STR, "reason": _STR, "trace_sha256": _STR, "corpus_sha256": _STR, "hardware_id": _STR,
    "model_revision": _STR, "tokenizer_revision": _STR, "vllm_version": _STR, "image_digest": _STR,
    "effective_args": "object or null", "generation": "object or null", "dispatch_lag_p99_ms": _OPT_NUM,
    "dispatch_lag_p50_ms": _OPT_NUM, "dispatch_lag_max_ms": _OPT_NUM, "achieved_rate_rps": _OPT_NUM,
    "requests_planned": _OPT_INT, "requests_sent": _INT,
}  # fmt: skip
# what identifies the run in the plan must be the directory's run (its key and planned windows):
RUN_IDENTITY: dict[str, str] = {
    "cell_id": _STR, "mixture": _STR, "rate": _STR, "repeat": _INT,
    "warmup_seconds": _NUM, "observation_seconds": _NUM, "drain_deadline_seconds": _NUM,
}  # fmt: skip
# and the exporting installation's own bookkeeping is read past, not applied.
RUN_NOT_APPLIED = (
    "run_id", "experiment", "position", "rate_rps", "scenario", "attempts", "retry_of", "host",
    "loop_stall_max_ms", "send_priority", "created_at", "started_at", "finished_at", "summary",
    "records_url",
)  # fmt: skip
RUN_JSON_TYPES: dict[str, str] = {
    **RUN_TYPES,
    **RUN_IDENTITY,
    **dict.fromkeys(RUN_NOT_APPLIED, _ANY),
    WINDOW_ALIAS: _WINDOW,  # a window resolve_aliases could not read
}
RUN_REQUIRED = ("status", "trace_sha256", "hardware_id")
RUN_STATUSES = ("done", "invalid", "failed")
# What a sweep run needs before the analysis can use it.
READY_FIELDS = ("trace_sha256", "hardware_id")
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
    if kind == _OPT_NUM:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
    if kind == _NUM:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == _WINDOW:
        return False  # a readable window was already mapped to the method's names
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


def _key(run: Run) -> str:
    return f"{run.cell.cell_id}~{run.mixture}~{run.rate_name}~{run.repeat}"


def _example_key(runs: dict[str, Run]) -> str:
    return next((k for k in runs if "~" in k), "B0~mixture~rate~1")


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
        runs = {str(r.run_id): r for r in experiment.runs.select_related("cell").order_by("id")}
        for r in list(runs.values()):
            if r.kind == Run.Kind.SWEEP:
                runs[_key(r)] = r  # in id order: a retry's key names the retry, not the failed run
        classes = set(experiment.classes.values_list("name", flat=True))
        found = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
        entries = [p for p in found if p.is_dir()]
        ignored = [p.name for p in found if not p.is_dir()]
        if ignored:  # a spec, a README or a generator beside the runs
            self.stdout.write(f"ignored files beside the run directories: {', '.join(ignored)}")
        if not entries:
            raise CommandError(f"{directory}: no run directories (one per run, named by its UUID or its key)")
        for p in entries:
            if p.name not in runs:
                try:
                    uuid.UUID(p.name)
                except ValueError:
                    raise CommandError(
                        f"{p}: the directory is named neither by a run UUID nor by a run key of experiment "
                        f"{experiment.pk} (<cell>~<mixture>~<rate>~<repeat>, e.g. {_example_key(runs)})"
                    ) from None
                raise CommandError(f"{p}: run {p.name} is not a run of experiment {experiment.pk}")
            if not any((p / name).is_file() for name in ("records.jsonl", "metrics.jsonl", "run.json")):
                raise CommandError(f"{p}: has none of run.json, records.jsonl, metrics.jsonl")
        self._accepting(experiment, [runs[p.name] for p in entries])
        totals = {"runs": 0, "records": 0, "samples": 0}
        with transaction.atomic():
            # Locked, and checked again: an approval cannot land between the check and the write.
            locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
            self._accepting(locked, [runs[p.name] for p in entries])
            for p in entries:
                run = runs[p.name]
                totals["runs"] += 1
                if (p / "run.json").is_file():
                    self._run_fields(p / "run.json", run)
                if (p / "records.jsonl").is_file():
                    totals["records"] += self._records(p / "records.jsonl", run, classes)
                if (p / "metrics.jsonl").is_file():
                    totals["samples"] += self._samples(p / "metrics.jsonl", run)
            self.stdout.write(
                f"imported {totals['records']} records and {totals['samples']} metric samples "
                f"for {totals['runs']} runs of experiment {experiment.pk}"
            )
            self._decide(locked)  # in the same transaction: a failed analysis leaves nothing half-done

    @staticmethod
    def _accepting(experiment: Experiment, runs: list[Run]) -> None:
        """The experiment's rule for adding records (Experiment.assert_accepts_runs), per run kind."""
        for kind in sorted({r.kind for r in runs}):
            try:
                experiment.assert_accepts_runs(kind=kind)
            except RunsRefused as exc:
                raise CommandError(f"{exc}. Nothing imported.") from None

    def _run_fields(self, path: Path, run: Run) -> None:
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CommandError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise CommandError(f"{path}: expected a JSON object")
        try:
            obj = resolve_aliases(obj)
        except AliasConflict as exc:
            raise CommandError(f"{path}: {exc}") from None
        _check(path, 1, obj, RUN_JSON_TYPES, RUN_REQUIRED)
        self._same_run(path, obj, run)
        obj = {k: v for k, v in obj.items() if k in RUN_TYPES}
        if obj["status"] not in RUN_STATUSES:
            raise CommandError(
                f"{path}: field status must be one of {', '.join(RUN_STATUSES)}, got {obj['status']!r}"
            )
        for name, value in obj.items():
            limit = getattr(Run._meta.get_field(name), "max_length", None)
            if isinstance(value, str) and limit and len(value) > limit:
                raise CommandError(f"{path}: field {name} is {len(value)} characters; at most {limit}")
        for name in ("requests_planned", "requests_sent"):
            if (obj.get(name) or 0) < 0:
                raise CommandError(f"{path}: field {name} must not be negative")
        for name in ("trace_sha256", "corpus_sha256"):
            value = obj.get(name)
            if value and (len(value) != 64 or any(c not in "0123456789abcdef" for c in value)):
                raise CommandError(f"{path}: field {name} must be 64 lowercase hex digits")
        fields = {k: v for k, v in obj.items() if k != "reason"}
        Run.objects.filter(pk=run.pk).update(
            **fields, reason=obj.get("reason", ""), finished_at=run.finished_at or timezone.now()
        )

    @staticmethod
    def _same_run(path: Path, obj: dict[str, Any], run: Run) -> None:
        """An exported record's identity and windows must be the directory's run's."""
        planned: dict[str, Any] = {
            "cell_id": run.cell.cell_id,
            "mixture": run.mixture,
            "rate": run.rate_name,
            "repeat": run.repeat,
            **windows(run.warmup_seconds, run.observation_seconds, run.drain_deadline_seconds),
        }
        for name, value in planned.items():
            if name in obj and obj[name] != value:
                raise CommandError(
                    f"{path}: field {name} is {obj[name]!r}, but the directory's run ({_key(run)}) "
                    f"has {value!r}: this record is another run's"
                )

    def _decide(self, experiment: Experiment) -> None:
        """Analyse when every sweep run is ready; else name what each run lacks."""
        from apps.analysis.services import experiment_analyse

        missing = []
        for run in (
            experiment.runs.filter(kind=Run.Kind.SWEEP).select_related("cell").order_by("plan_position")
        ):
            lacks = [f for f in READY_FIELDS if not getattr(run, f)]
            if run.status not in Run.FINISHED:
                lacks.insert(0, "status")
            if lacks:
                missing.append(f"  run {_key(run)} ({run.run_id}): run.json needs {', '.join(lacks)}")
        if missing:
            self.stdout.write(
                f"no decision yet: {len(missing)} runs cannot be analysed\n"
                + "\n".join(missing[:50])
                + ("" if len(missing) <= 50 else f"\n  and {len(missing) - 50} more")
            )
            return
        decision = experiment_analyse(experiment_id=experiment.pk)
        experiment_transition(
            experiment,
            Experiment.Status.ANALYSED,
            reason="analysed from imported results",
            actor=None,
            action="experiment.analysed",
            detail={
                "source": "results_import",
                "decision": decision.outcome,
                "chosen_cell": decision.chosen_cell,
            },
            expect=Experiment.ANALYSED_BY_IMPORT,
        )
        self.stdout.write(f"decision: {decision.outcome} {decision.chosen_cell}\nrule: {decision.rule}")

    def _records(self, path: Path, run: Run, classes: set[str]) -> int:
        names = {str(run.run_id), _key(run)}
        seen: set[int] = set()
        batch: list[RecordRow] = []
        count = 0
        for number, obj in _lines(path):
            _check(path, number, obj, RECORD_TYPES, REQUIRED)
            where = f"{path}:{number}"
            if obj["run_id"] not in names:
                raise CommandError(
                    f"{where}: run_id {obj['run_id']!r} does not match the directory's run ({' or '.join(sorted(names))})"
                )
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
