"""results_import reads exported run records back (issue #34 item 4): a run.json that is
``GET /api/v1/runs/<uuid>`` under the method's names, and one under the older names (``cell``,
``window``); the record's identity must be the directory's run, and a bad one saves nothing."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.experiments.models import Experiment
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.models import Run
from apps.runs.record_names import RUN_RECORD_FIELDS, WINDOW_NAMES
from tests.analysis.factories import analysis_spec, done_experiment
from tests.experiments.factories import UserFactory, make_experiment
from workers.replay.records import SERVER_TIMING_FIELDS

pytestmark = pytest.mark.django_db

APPLIED = ("status", "trace_sha256", "corpus_sha256", "hardware_id", "dispatch_lag_p99_ms", "requests_sent")


def _key(run: Run) -> str:
    return f"{run.cell.cell_id}~{run.mixture}~{run.rate_name}~{run.repeat}"


def _source() -> tuple[Experiment, dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """An experiment whose runs are done, exported through the API: (it, records by key, records
    of each run as the API exports them, by key)."""
    experiment, records = done_experiment(store=False)
    by_run: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_run.setdefault(rec.run_id, []).append(rec.to_json())
    for run in experiment.runs.select_related("cell"):
        digest = hashlib.sha256(f"{run.mixture}/{run.rate_name}/{run.repeat}".encode()).hexdigest()
        Run.objects.filter(pk=run.pk).update(
            trace_sha256=digest, corpus_sha256=digest[::-1], requests_sent=len(by_run[str(run.run_id)])
        )
    _, plaintext = token_create(user=UserFactory(roles=["viewer"]), name="export")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    exported: dict[str, dict[str, Any]] = {}
    lines: dict[str, list[dict[str, Any]]] = {}
    for run in experiment.runs.select_related("cell").filter(kind=Run.Kind.SWEEP):
        response = api.get(f"/api/v1/runs/{run.run_id}")
        assert response.status_code == 200
        exported[_key(run)] = response.json()
        lines[_key(run)] = [{**r, "run_id": _key(run)} for r in by_run[str(run.run_id)]]
    return experiment, lines, exported


def _older(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the export wrote it before the method's names: ``cell`` and ``window`` only."""
    old = {k: v for k, v in record.items() if k != "cell_id" and k not in WINDOW_NAMES.values()}
    old.pop("position")
    old.pop("created_at")
    assert old["cell"] == record["cell_id"]
    assert old["window"] == {k: record[v] for k, v in WINDOW_NAMES.items()}
    return old


def _write(directory: Path, lines: dict[str, list[dict[str, Any]]], runs: dict[str, dict[str, Any]]) -> Path:
    for key, record in runs.items():
        (directory / key).mkdir()
        (directory / key / "run.json").write_text(json.dumps(record))
        (directory / key / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines[key]))
    return directory


@pytest.mark.parametrize("naming", ["method", "older"])
def test_an_exported_run_record_is_read_back_in_either_naming(tmp_path: Path, naming: str) -> None:
    source, lines, exported = _source()
    first = next(iter(exported.values()))
    assert set(RUN_RECORD_FIELDS) <= set(first)  # the export carries the method's names
    runs = exported if naming == "method" else {k: _older(v) for k, v in exported.items()}
    target = make_experiment(**analysis_spec(2))
    out = io.StringIO()
    call_command(
        "results_import", "--experiment", str(target.pk), str(_write(tmp_path, lines, runs)), stdout=out
    )
    assert "decision:" in out.getvalue()
    target.refresh_from_db()
    assert target.status == "analysed"
    for run in target.runs.select_related("cell").filter(kind=Run.Kind.SWEEP):
        record = exported[_key(run)]
        assert {f: getattr(run, f) for f in APPLIED} == {f: record[f] for f in APPLIED}
        assert RecordRow.objects.filter(run=run).count() == len(lines[_key(run)])
        # The exporting installation's own values are read past: this run keeps its own.
        assert str(run.run_id) != record["run_id"] and run.experiment_id != source.pk


def _rejected(tmp_path: Path, change: Any, message: str) -> None:
    _, lines, exported = _source()
    key = next(iter(exported))
    record = dict(exported[key])
    change(record)
    target = make_experiment(**analysis_spec(2))
    directory = _write(tmp_path, {key: lines[key]}, {key: record})
    with pytest.raises(CommandError, match=message):
        call_command("results_import", "--experiment", str(target.pk), str(directory), stdout=io.StringIO())
    assert not RecordRow.objects.filter(run__experiment=target).exists()
    assert not target.runs.exclude(trace_sha256="").exists()


def test_a_record_of_another_cell_is_refused(tmp_path: Path) -> None:
    def other_cell(record: dict[str, Any]) -> None:
        record["cell_id"] = record["cell"] = "C1" if record["cell_id"] == "B0" else "B0"

    _rejected(tmp_path, other_cell, r"run.json: field cell_id is '(B0|C1)', but the directory's run")


def test_other_windows_are_another_run(tmp_path: Path) -> None:
    def longer(record: dict[str, Any]) -> None:
        record["observation_seconds"] += 1
        record["window"] = {**record["window"], "observation_s": record["observation_seconds"]}

    _rejected(tmp_path, longer, "field observation_seconds is 11.0, but the directory's run")


def test_a_name_and_its_alias_that_disagree_are_refused(tmp_path: Path) -> None:
    def disagree(record: dict[str, Any]) -> None:
        record["window"] = {**record["window"], "warmup_s": 99.0}

    _rejected(tmp_path, disagree, "field warmup_seconds and its older name window.warmup_s disagree")


def test_an_unreadable_window_is_named(tmp_path: Path) -> None:
    def broken(record: dict[str, Any]) -> None:
        record["window"] = {"warmup": 1}

    _rejected(
        tmp_path, broken, "field window must be an object of warmup_s, observation_s and drain_deadline_s"
    )


def test_an_unknown_field_is_still_refused(tmp_path: Path) -> None:
    def unknown(record: dict[str, Any]) -> None:
        record["cell_name"] = "B0"

    _rejected(tmp_path, unknown, r"unknown field\(s\) cell_name")


def test_the_servers_timings_of_each_record_are_imported_and_exported_again(tmp_path: Path) -> None:
    _, lines, exported = _source()
    timed = {
        key: [
            {**r, "server_queue_ns": 1_000 * r["index"], "server_prefill_ns": 2_000, "server_ttft_ns": 5_000}
            for r in records
        ]
        for key, records in lines.items()
    }
    target = make_experiment(**analysis_spec(2))
    directory = _write(tmp_path, timed, exported)
    call_command("results_import", "--experiment", str(target.pk), str(directory), stdout=io.StringIO())
    run = target.runs.select_related("cell").filter(kind=Run.Kind.SWEEP).first()
    assert run is not None
    row = RecordRow.objects.filter(run=run).order_by("index").last()
    assert row is not None
    assert (row.server_queue_ns, row.server_prefill_ns, row.server_ttft_ns) == (
        1_000 * row.index,
        2_000,
        5_000,
    )
    assert row.server_decode_ns is None and row.server_e2e_ns is None  # not in the file: not measured
    _, plaintext = token_create(user=UserFactory(roles=["viewer"]), name="again")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    page = api.get(f"/api/v1/runs/{run.run_id}/records?page_size=1000").json()["records"]
    again = next(r for r in page if r["index"] == row.index)
    assert {k: again[k] for k in SERVER_TIMING_FIELDS} == {k: getattr(row, k) for k in SERVER_TIMING_FIELDS}


def test_a_server_timing_that_is_not_an_integer_is_refused_naming_it(tmp_path: Path) -> None:
    _, lines, exported = _source()
    key = next(iter(exported))
    bad = [{**lines[key][0], "server_queue_ns": 1.5}, *lines[key][1:]]
    target = make_experiment(**analysis_spec(2))
    directory = _write(tmp_path, {key: bad}, {key: exported[key]})
    with pytest.raises(CommandError, match="field server_queue_ns must be int or null"):
        call_command("results_import", "--experiment", str(target.pk), str(directory), stdout=io.StringIO())
