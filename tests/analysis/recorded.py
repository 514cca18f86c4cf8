"""A result set recorded on a real engine, kept in the repository, as build_report's inputs.

A folder written by bench/analysis/record_aa.py holds:

- ``experiment.json``: ``experiment``, ``cells``, ``classes``, ``runs`` and ``options`` exactly as
  apps/analysis/services.experiment_report_build hands them to build_report, plus ``rehearse``;
- ``records.jsonl.gz``: every request record of the done runs, one
  ``workers.replay.records.RequestRecord.to_json()`` a line (run_id is the run's key);
- ``samples.jsonl.gz``: the /metrics samples the report reads, one ``{"run": key, ...}`` a line;
- ``recording.json``: when, how and on what it was recorded (not an input).

No database and no engine: the records go through RecordTable.from_records and the real
build_report, as the service would analyse them.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from apps.analysis.columns import RecordTable
from apps.analysis.report import build_report
from apps.analysis.report_types import Report
from workers.replay.records import RequestRecord


def read_jsonl_gz(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_records(folder: Path) -> list[RequestRecord]:
    return [RequestRecord.from_json(row) for row in read_jsonl_gz(folder / "records.jsonl.gz")]


def stop_reasons(records: list[RequestRecord]) -> dict[str, dict[str, dict[str, int]]]:
    """run key -> class -> finish_reason -> requests, warm-up and unsent left out (run_digest.stop_reasons)."""
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.warmup or not r.sent:
            continue
        by = out[r.run_id][r.request_class]
        reason = r.finish_reason or "none"
        by[reason] = by.get(reason, 0) + 1
    return {k: dict(v) for k, v in out.items()}


def report_inputs(folder: Path) -> dict[str, Any]:
    """build_report's keyword arguments for the recorded set in ``folder``."""
    meta = json.loads((folder / "experiment.json").read_text())
    records = load_records(folder)
    samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if (folder / "samples.jsonl.gz").is_file():
        for row in read_jsonl_gz(folder / "samples.jsonl.gz"):
            samples[row.pop("run")].append(row)
    return {
        "experiment": meta["experiment"],
        "cells": meta["cells"],
        "classes": meta["classes"],
        "runs": meta["runs"],
        "table": RecordTable.from_records(records),
        "samples": dict(samples),
        "rollback": {"exists": False, "baseline": None},
        "options": meta.get("options"),
        "rehearse": bool(meta.get("rehearse", False)),
        "stop_reasons": stop_reasons(records),
    }


def recorded_report(folder: Path) -> Report:
    return build_report(**report_inputs(folder))
