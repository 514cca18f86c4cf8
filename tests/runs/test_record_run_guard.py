"""The records' run without a foreign key check on the database (migration runs/0019): what the
check kept is still kept. No record of a run that does not exist: the ingest refuses a missing
run and locks the run's row per batch, and the database refuses to delete or renumber a run
that still has records, whoever asks, at commit, with the records a concurrent batch committed
by then in view. Django's own deletes (CASCADE) go on working."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import IntegrityError, OperationalError, close_old_connections, connection, transaction

from apps.runs.ingest import records_ingest
from apps.runs.models import RequestRecord, Run
from tests.experiments.factories import make_experiment
from tests.runs.factories import observed

ROOT = Path(__file__).resolve().parents[2]


def _raw(sql: str, *params: object) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, list(params))


def _batch(run: Run, n: int = 5, first: int = 0) -> list:
    return [observed(str(run.run_id), i) for i in range(first, first + n)]


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_to_delete_or_renumber_a_run_that_has_records() -> None:
    run = make_experiment().runs.first()
    assert records_ingest(run_pk=run.pk, records=_batch(run)) == 5
    table = Run._meta.db_table
    with pytest.raises(IntegrityError, match=f"run {run.pk} still has request records"):
        _raw(f'DELETE FROM "{table}" WHERE "id" = %s', run.pk)  # noqa: S608 - names are ours
    with pytest.raises(IntegrityError, match="still has request records"):
        _raw(f'UPDATE "{table}" SET "id" = "id" + 1000000 WHERE "id" = %s', run.pk)  # noqa: S608
    _raw(f'UPDATE "{table}" SET "status" = "status" WHERE "id" = %s', run.pk)  # noqa: S608 - no key change
    assert RequestRecord.objects.filter(run_id=run.pk).count() == 5
    # A run without records is deleted as before; the ORM deletes a run's records first (CASCADE).
    other = Run.objects.exclude(pk=run.pk).filter(experiment=run.experiment).first()
    _raw(f'DELETE FROM "{table}" WHERE "id" = %s', other.pk)  # noqa: S608
    run.experiment.delete()
    assert not RequestRecord.objects.filter(run_id=run.pk).exists()
    assert not Run.objects.filter(pk=run.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_batch_for_a_run_that_does_not_exist_is_refused_and_writes_nothing() -> None:
    run = make_experiment().runs.first()
    missing = Run.objects.order_by("-pk").values_list("pk", flat=True).first() + 1000
    with pytest.raises(Run.DoesNotExist, match=f"run {missing} does not exist"):
        records_ingest(run_pk=missing, records=_batch(run))
    assert not RequestRecord.objects.filter(run_id=missing).exists()


def _in_thread(work: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.django_db(transaction=True)
def test_a_delete_waits_for_a_batch_in_flight_and_then_sees_its_records() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the row lock and the deferred guard are Postgres's; SQLite has one writer")
    run = make_experiment().runs.first()
    written, release = threading.Event(), threading.Event()

    def batch_held_open() -> None:
        with transaction.atomic():
            records_ingest(run_pk=run.pk, records=_batch(run, 7))
            written.set()
            assert release.wait(30)

    writer, writer_errors = _in_thread(batch_held_open)
    assert written.wait(30), writer_errors
    table = Run._meta.db_table
    # The batch holds the run's row as a foreign key's check would: a delete cannot take it.
    with pytest.raises(OperationalError, match="lock timeout"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '300ms'")
            cursor.execute(f'DELETE FROM "{table}" WHERE "id" = %s', [run.pk])  # noqa: S608
    # A delete that waits gets the row once the batch commits, and the guard, at the delete's
    # commit, sees the batch's records: refused.
    deleter, delete_errors = _in_thread(lambda: _raw(f'DELETE FROM "{table}" WHERE "id" = %s', run.pk))  # noqa: S608
    deleter.join(0.5)
    assert deleter.is_alive()  # waiting on the batch's lock
    release.set()
    writer.join(30)
    deleter.join(30)
    assert not writer_errors
    assert len(delete_errors) == 1 and isinstance(delete_errors[0], IntegrityError)
    assert "still has request records" in str(delete_errors[0])
    assert RequestRecord.objects.filter(run_id=run.pk).count() == 7 and Run.objects.filter(pk=run.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_waits_on_a_deleted_run_writes_nothing() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the row lock and the deferred guard are Postgres's; SQLite has one writer")
    run = make_experiment().runs.first()
    table = Run._meta.db_table
    deleted, release = threading.Event(), threading.Event()

    def delete_held_open() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f'DELETE FROM "{table}" WHERE "id" = %s', [run.pk])  # noqa: S608
            deleted.set()
            assert release.wait(30)

    deleter, delete_errors = _in_thread(delete_held_open)
    assert deleted.wait(30), delete_errors
    results: list[int] = []
    writer, writer_errors = _in_thread(
        lambda: results.append(records_ingest(run_pk=run.pk, records=_batch(run)))
    )
    writer.join(0.5)
    assert writer.is_alive()  # waiting on the delete's lock of the run
    release.set()
    deleter.join(30)
    writer.join(30)
    assert not delete_errors and not results
    assert len(writer_errors) == 1 and isinstance(writer_errors[0], Run.DoesNotExist)
    assert not RequestRecord.objects.filter(run_id=run.pk).exists()


_SQLITE_CHECK = """
import django
django.setup()
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
call_command("migrate", verbosity=0)
from apps.runs.ingest import records_ingest
from apps.runs.models import RequestRecord, Run
from tests.experiments.factories import make_experiment
from tests.runs.factories import observed
run = make_experiment().runs.first()
assert records_ingest(run_pk=run.pk, records=[observed(str(run.run_id), i) for i in range(3)]) == 3
for sql in ('DELETE FROM "runs_run" WHERE "id" = %s', 'UPDATE "runs_run" SET "id" = "id" + 1000 WHERE "id" = %s'):
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [run.pk])
    except IntegrityError as exc:
        assert "still has request records" in str(exc), exc
    else:
        raise AssertionError(f"not refused: {sql}")
try:
    records_ingest(run_pk=run.pk + 1000, records=[observed("x", 0)])
except Run.DoesNotExist:
    pass
else:
    raise AssertionError("a missing run's batch was taken")
run.experiment.delete()
assert not RequestRecord.objects.exists()
print("guarded")
"""


def test_the_embedded_sqlite_database_has_the_same_guard(tmp_path: Path) -> None:
    # The embedded default (no DATABASE_URL) on a database of its own, migrated from scratch.
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'embedded.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", _SQLITE_CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("guarded")
