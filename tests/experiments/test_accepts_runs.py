"""One rule for decided experiments: no writer adds runs or records to an analysed, approved,
rejected or revoked experiment, except the rollback rehearsal while the experiment is analysed.

``WRITERS`` names every function of the code that creates a runs.Run, RequestRecord or
MetricSample row; ``test_every_writer_of_runs_and_records_is_listed`` reads the source (ast) and
fails on a writer it does not list, so a new one cannot skip the rule.
``test_every_writer_refuses_a_decided_experiment`` walks the entry points behind them.
"""

from __future__ import annotations

import ast
import io
import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.experiments.models import RUN_KINDS_ACCEPTED, Experiment, RunsRefused
from apps.runs.models import MetricSample, RequestRecord, Run
from apps.workloads.models import Trace
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import make_experiment
from tests.runs.factories import make_host, observed

ROOT = Path(__file__).resolve().parents[2]
DECIDED = ("analysed", "approved", "rejected", "revoked")

# (module, function) of every place that creates Run, RequestRecord or MetricSample rows (or
# builds them for a caller that does), and the guarded entry point that covers it.
WRITERS: dict[tuple[str, str], str] = {
    ("apps/lifecycle/planning.py", "experiment_plan"): "experiment_plan",
    ("apps/lifecycle/planning.py", "_uniform_companions"): "experiment_plan",
    ("apps/lifecycle/planning.py", "plan_runs_build"): "experiment_plan",
    # A search's trials and its confirmation (apps/lifecycle/search_steps.py).
    ("apps/lifecycle/search_steps.py", "_trial_create"): "search_advance",
    ("apps/lifecycle/search_steps.py", "_confirm"): "search_advance",
    ("apps/lifecycle/scenario_schedule.py", "scenario_runs_build"): "experiment_plan",
    ("apps/lifecycle/scenario_schedule.py", "probe_run_create"): "probe_run_create",
    ("apps/lifecycle/retries.py", "_requeue"): "run_requeue_once",
    ("apps/lifecycle/rehearsal_schedule.py", "_create"): "rehearsal_create",
    # The one run builder: every caller above saves what it builds, under the caller's guard.
    ("apps/lifecycle/runs.py", "run_build"): "experiment_plan",
    ("apps/lifecycle/runs.py", "run_retry_build"): "run_requeue_once",
    ("apps/runs/ingest.py", "records_ingest"): "records_ingest",
    ("apps/runs/ingest.py", "_records_copy"): "records_ingest",
    # A batch the savepointed COPY refused (a row stored already): called only from the above.
    ("apps/runs/ingest.py", "_copy_via_temp_table"): "records_ingest",
    # Builds the COPY text of the rows records_ingest writes (it writes nothing itself).
    ("apps/runs/copy_text.py", "copy_text"): "records_ingest",
    ("apps/runs/ingest.py", "metric_samples_ingest"): "metric_samples_ingest",
    ("apps/runs/ingest.py", "records_server_timings_ingest"): "records_server_timings_ingest",
    ("apps/analysis/management/commands/results_import.py", "Command._records"): "results_import",
    ("apps/analysis/management/commands/results_import.py", "Command._flush"): "results_import",
    ("apps/analysis/management/commands/results_import.py", "Command._samples"): "results_import",
}
GUARDED_MODELS = {"Run", "RequestRecord", "MetricSample"}
RUN_BUILDERS = {"run_build", "run_retry_build"}  # apps/lifecycle/runs.py: a call builds a Run
WRITE_METHODS = {"create", "bulk_create", "get_or_create", "update_or_create"}
RELATED_MANAGERS = {"runs", "records", "metric_samples", "retry"}
RAW_WRITE = re.compile(
    r"\bINSERT\s+INTO\b|\bCOPY\b.*\bFROM\s+STDIN\b"
)  # SQL keywords as our code writes them


def _model_aliases(tree: ast.Module) -> set[str]:
    """Local names bound to apps.runs.models' Run, RequestRecord and MetricSample."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "apps.runs.models":
            names |= {a.asname or a.name for a in node.names if a.name in GUARDED_MODELS}
    return names


def _literal_text(node: ast.JoinedStr) -> str:
    """An f-string's literal parts joined, each value as a placeholder: ``f"COPY {t} (..) FROM
    STDIN"`` reads as one statement, which its parts alone do not."""
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def _writes(tree: ast.Module) -> set[str]:
    """Qualified names of the functions that write (or build) guarded rows."""
    aliases = _model_aliases(tree)
    found: set[str] = set()

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            where = ".".join(scope) or "<module>"
            if isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Name) and (func.id in aliases or func.id in RUN_BUILDERS):
                    found.add(where)  # an unsaved row, built for a bulk write or a save
                if isinstance(func, ast.Attribute) and func.attr in WRITE_METHODS:
                    owner = func.value
                    if (
                        isinstance(owner, ast.Attribute)
                        and owner.attr == "objects"
                        and isinstance(owner.value, ast.Name)
                        and owner.value.id in aliases
                    ) or (isinstance(owner, ast.Attribute) and owner.attr in RELATED_MANAGERS):
                        found.add(where)
            if (
                isinstance(child, ast.Constant)
                and isinstance(child.value, str)
                and RAW_WRITE.search(child.value)
            ) or (isinstance(child, ast.JoinedStr) and RAW_WRITE.search(_literal_text(child))):
                found.add(where)  # raw SQL: COPY ... FROM STDIN, INSERT INTO
            visit(child, scope)

    visit(tree, [])
    return found


def test_every_writer_of_runs_and_records_is_listed() -> None:
    found = set()
    for folder in ("apps", "workers", "clients", "config"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            rel = str(path.relative_to(ROOT))
            found |= {(rel, name) for name in _writes(ast.parse(path.read_text(encoding="utf-8")))}
    unlisted = sorted(found - set(WRITERS))
    assert not unlisted, (
        f"new writers of runs or records: {unlisted}. Call Experiment.assert_accepts_runs before the "
        "write, add the function to WRITERS and its entry point to the walk below"
    )
    assert sorted(set(WRITERS) - found) == [], "a listed writer no longer writes: drop it from WRITERS"


def test_the_rule_names_every_status() -> None:
    assert set(RUN_KINDS_ACCEPTED) == set(Experiment.Status.values)
    assert {s for s, kinds in RUN_KINDS_ACCEPTED.items() if kinds is not None} == set(DECIDED)


# -- the walk ----------------------------------------------------------------------------


def _trace() -> Trace:
    return Trace.objects.get_or_create(
        sha256="a" * 64,
        defaults={"corpus_sha256": "b" * 64, "requests": 1, "duration_s": 1.0, "content_gz": b""},
    )[0]


def _sweep_run(experiment: Experiment) -> Run:
    return experiment.runs.filter(kind=Run.Kind.SWEEP).order_by("plan_position").first()  # type: ignore[return-value]


def _rehearsal_run(experiment: Experiment) -> Run:
    run = _sweep_run(experiment)
    run.pk = None
    run.run_id = uuid.uuid4()
    run.kind, run.plan_position = Run.Kind.REHEARSAL, 999
    Run.objects.bulk_create([run])  # the test's own row, as rehearsal_start would make it
    return Run.objects.get(experiment=experiment, kind=Run.Kind.REHEARSAL)


def _experiment_plan(e: Experiment, kind: str) -> None:
    from apps.lifecycle.planning import experiment_plan

    experiment_plan(experiment=e)


def _probe_run_create(e: Experiment, kind: str) -> None:
    from apps.lifecycle.scenario_schedule import probe_run_create

    probe_run_create(
        experiment=e, cell=e.cells.first(), trace=_trace(), mixture="80-20", rate_name="probe0",
        rate_rps=1.0, position=0, windows={"warmup_s": 1, "observation_s": 1, "drain_deadline_s": 1},
    )  # fmt: skip


def _cell_goodput_capacity(e: Experiment, kind: str) -> None:
    from apps.lifecycle.calibration import cell_goodput_capacity

    def execute(*, run_pk: int) -> str:
        raise AssertionError("a probe run of a decided experiment was executed")

    cell_goodput_capacity(experiment_id=e.pk, cell_id="C1", mixture="80-20", execute=execute)


def _goodput_capacity_request(e: Experiment, kind: str) -> None:
    from apps.lifecycle.calibration import goodput_capacity_request

    goodput_capacity_request(experiment=e, cell_id="C1", mixture="80-20")


def _experiment_calibrate_command(e: Experiment, kind: str) -> None:
    try:
        call_command(
            "experiment_calibrate", str(e.pk), "--cell", "C1", "--mixture", "80-20", stdout=io.StringIO()
        )
    except CommandError as exc:
        raise RunsRefused(str(exc)) from None


def _run_requeue_once(e: Experiment, kind: str) -> None:
    from apps.lifecycle.retries import run_requeue_once

    run = _rehearsal_run(e) if kind == "rehearsal" else _sweep_run(e)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.MEASURING)
    run_requeue_once(run=run, reason="host lost")


def _rehearsal_create(e: Experiment, kind: str) -> None:
    from apps.lifecycle.rehearsal_schedule import RehearsalError, _create

    e.runs.filter(kind=Run.Kind.SWEEP).update(trace_sha256="c" * 64)
    try:
        _create(e, e.cells.get(cell_id="C1"))
    except RehearsalError as exc:  # the rehearsal's own error, so its page and task say why
        raise RunsRefused(str(exc)) from None


def _records_ingest(e: Experiment, kind: str) -> None:
    from apps.runs.ingest import records_ingest

    run = _rehearsal_run(e) if kind == "rehearsal" else _sweep_run(e)
    records_ingest(run_pk=run.pk, records=[observed(str(run.run_id), i) for i in range(3)])


def _records_server_timings_ingest(e: Experiment, kind: str) -> None:
    from apps.runs.ingest import records_server_timings_ingest
    from tests.runs.test_ingest import _with_timings

    run = _rehearsal_run(e) if kind == "rehearsal" else _sweep_run(e)
    records_server_timings_ingest(
        run_pk=run.pk, records=[_with_timings(observed(str(run.run_id), i), i) for i in range(3)]
    )


def _metric_samples_ingest(e: Experiment, kind: str) -> None:
    from apps.runs.ingest import metric_samples_ingest

    run = _rehearsal_run(e) if kind == "rehearsal" else _sweep_run(e)
    sample = {
        "t_ns": 0,
        "phase": "during",
        "name": "vllm:num_requests_running",
        "kind": "gauge",
        "value": 1.0,
    }
    metric_samples_ingest(run_pk=run.pk, samples=[sample])


def _results_import(e: Experiment, kind: str, tmp_path: Path) -> None:
    run = _rehearsal_run(e) if kind == "rehearsal" else _sweep_run(e)
    folder = tmp_path / str(run.run_id)
    folder.mkdir()
    (folder / "records.jsonl").write_text(json.dumps(observed(str(run.run_id), 0).to_json()) + "\n")
    (folder / "metrics.jsonl").write_text(
        json.dumps({"t_ns": 0, "phase": "during", "name": "vllm:num_requests_running", "kind": "gauge"})
        + "\n"
    )
    try:
        call_command("results_import", "--experiment", str(e.pk), str(tmp_path), stdout=io.StringIO())
    except CommandError as exc:
        raise RunsRefused(str(exc)) from None


def _search_advance(e: Experiment, kind: str) -> None:
    from apps.lifecycle.search_steps import search_advance

    spec = {**e.spec, "search": {"space": {"max_num_seqs": {"values": [8, 16]}}, "confirm": 1,
            "budget": {"max_trials": 4}, "screening": {"mixture": "80-20", "rate": "low"}}}  # fmt: skip
    Experiment.objects.filter(pk=e.pk).update(spec=spec)
    search_advance(experiment_id=e.pk)


ENTRIES: dict[str, Callable[..., None]] = {
    "search_advance": _search_advance,
    "experiment_plan": _experiment_plan,
    "probe_run_create": _probe_run_create,
    "cell_goodput_capacity": _cell_goodput_capacity,
    "goodput_capacity_request": _goodput_capacity_request,
    "experiment_calibrate --cell": _experiment_calibrate_command,
    "run_requeue_once": _run_requeue_once,
    "rehearsal_create": _rehearsal_create,
    "records_ingest": _records_ingest,
    "metric_samples_ingest": _metric_samples_ingest,
    "records_server_timings_ingest": _records_server_timings_ingest,
    "results_import": _results_import,
}


def _evidence(e: Experiment) -> tuple[list[int], int, int]:
    runs = sorted(Run.objects.filter(experiment=e).values_list("pk", flat=True))
    records = RequestRecord.objects.filter(run__experiment=e).count()
    samples = MetricSample.objects.filter(run__experiment=e).count()
    return runs, records, samples


def _call(name: str, e: Experiment, kind: str, tmp_path: Path) -> None:
    entry = ENTRIES[name]
    if name == "results_import":
        entry(e, kind, tmp_path)
    else:
        entry(e, kind)


def test_every_listed_writer_has_an_entry_in_the_walk() -> None:
    assert set(WRITERS.values()) <= set(ENTRIES)


@pytest.mark.django_db
@pytest.mark.parametrize("status", DECIDED)
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_writer_refuses_a_decided_experiment(name: str, status: str, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    hold_tasks(monkeypatch)
    make_host()
    e = make_experiment()
    Experiment.objects.filter(pk=e.pk).update(status=status)
    before = _evidence(e)
    refused: Exception | None = None
    try:
        _call(name, e, "sweep", tmp_path)
    except RunsRefused as exc:
        refused = exc
    if name == "rehearsal_create" and status == "analysed":
        assert refused is None  # the exception: the rollback rehearsal (the test below)
        return
    assert _evidence(e) == before, f"{name} added runs or records to a {status} experiment"
    if name in ("run_requeue_once", "search_advance"):
        return  # a retry, a trial or a confirmation is made only while the experiment runs
    assert refused is not None, f"{name} did not say why it refused a {status} experiment"
    assert f"experiment {e.pk} is {status}" in str(refused)
    if name == "cell_goodput_capacity":
        e.workload.refresh_from_db()
        entry = e.workload.rates_derivation["goodput_capacity"]["C1"]["80-20"]
        assert entry["status"] == "failed" and f"is {status}" in entry["reason"]


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["rehearsal_create", "records_ingest", "metric_samples_ingest"])
def test_the_rollback_rehearsal_may_add_to_an_analysed_experiment_only(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Check 4 is part of deciding: its runs and their records while analysed, never after."""
    e = make_experiment()
    Experiment.objects.filter(pk=e.pk).update(status="analysed")
    _call(name, e, "rehearsal", tmp_path)
    rehearsal = Run.objects.get(experiment=e, kind=Run.Kind.REHEARSAL)
    if name == "records_ingest":
        assert rehearsal.records.count() == 3
    if name == "metric_samples_ingest":
        assert rehearsal.metric_samples.count() == 1
    for status in ("approved", "rejected", "revoked"):
        Experiment.objects.filter(pk=e.pk).update(status=status)
        Run.objects.filter(experiment=e, kind=Run.Kind.REHEARSAL).delete()
        with pytest.raises(RunsRefused, match=f"experiment {e.pk} is {status}"):
            _call(name, e, "rehearsal", tmp_path)


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["planned", "running", "cancelled"])
def test_an_undecided_experiment_still_takes_runs_and_records(status: str) -> None:
    e = make_experiment()
    Experiment.objects.filter(pk=e.pk).update(status=status)
    _probe_run_create(e, "sweep")
    _records_ingest(e, "sweep")
    assert e.runs.filter(kind=Run.Kind.CALIBRATION).count() == 1
    assert RequestRecord.objects.filter(run__experiment=e).count() == 3


# -- the pages answer with the reason, never a 500 ------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("status", DECIDED)
def test_the_goodput_page_refuses_a_decided_experiment_with_the_reason(
    client, author, experiment, status: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from apps.runs.dispatch import CELL_GOODPUT_CAPACITY

    sent = hold_tasks(monkeypatch, CELL_GOODPUT_CAPACITY)
    make_host()
    Experiment.objects.filter(pk=experiment.pk).update(status=status)
    client.force_login(author)
    response = client.post(
        f"/experiments/{experiment.pk}/goodput/", {"cell": "C1", "mixture": "80-20"}, follow=True
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert f"Goodput capacity not queued: experiment {experiment.pk} is {status}" in page
    assert not sent
    experiment.workload.refresh_from_db()
    assert "goodput_capacity" not in (experiment.workload.rates_derivation or {})


@pytest.mark.django_db
@pytest.mark.parametrize("status", DECIDED)
def test_a_class_capacity_search_is_refused_like_a_goodput_search(
    client, author, experiment, status: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # An isolate decision's pools are measured before the analysis (docs/ANALYSIS.md, "Isolate
    # sizes its pools"): an analysed experiment takes no probe run, whatever it is for.
    from apps.runs.dispatch import CELL_GOODPUT_CAPACITY

    sent = hold_tasks(monkeypatch, CELL_GOODPUT_CAPACITY)
    make_host()
    Experiment.objects.filter(pk=experiment.pk).update(status=status)
    client.force_login(author)
    page = client.post(
        f"/experiments/{experiment.pk}/goodput/", {"cell": "C1", "request_class": "short"}, follow=True
    ).content.decode()
    assert f"Capacity of C1 for short alone not queued: experiment {experiment.pk} is {status}" in page
    assert not sent
    experiment.workload.refresh_from_db()
    assert "class_capacity" not in (experiment.workload.rates_derivation or {})


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["approved", "rejected", "revoked"])
def test_the_rehearse_page_refuses_a_decided_experiment_with_the_reason(
    client, author, experiment, status: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    hold_tasks(monkeypatch)
    make_host()
    Experiment.objects.filter(pk=experiment.pk).update(status=status)
    client.force_login(author)
    response = client.post(f"/experiments/{experiment.pk}/rehearse/", {"cell": "C1"}, follow=True)
    assert response.status_code < 500
    assert f"is {status}" in response.content.decode()
    assert not experiment.runs.filter(kind=Run.Kind.REHEARSAL).exists()


@pytest.mark.django_db
def test_the_experiment_page_offers_a_goodput_search_only_while_it_takes_runs(
    client, author, experiment
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    page = client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert 'id="goodput-form"' in page and 'id="goodput-refused"' not in page
    for status in DECIDED:
        Experiment.objects.filter(pk=experiment.pk).update(status=status)
        page = client.get(f"/experiments/{experiment.pk}/").content.decode()
        assert 'id="goodput-form"' not in page
        assert f"No goodput search can be queued: the experiment is {status}:" in page
