"""Bulk writes of measurements while a run goes on.

Postgres gets ``COPY`` (through psycopg 3) straight into the table, one
transaction a batch; a batch that breaks the unique (run, index) constraint (a
retried batch) is rolled back and goes through a temporary table and one
``INSERT ... ON CONFLICT DO NOTHING`` instead, so a retried batch stays harmless.
SQLite (the embedded default) gets ``bulk_create(ignore_conflicts=True)``,
which is the same guarantee.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.utils import timezone

from apps.experiments.models import Experiment, runs_refuse
from apps.runs.copy_text import Kind, copy_text
from apps.runs.models import MetricSample, RequestRecord, Run, RunDigest
from workers.replay.records import SERVER_TIMING_FIELDS
from workers.replay.records import RequestRecord as Observed

_RECORD_COLUMNS = (
    "run_id", "index", "request_class", "warmup", "priority", "input_tokens", "expected_output_tokens",
    "planned_ns", "sent", "sent_ns", "admission_delay_ns", "first_token_ns", "last_token_ns", "end_ns",
    "output_tokens", "prompt_tokens", "chunks", "max_gap_ns", "chunk_gaps", "token_gaps", "http_status",
    "error_kind", "error", "finish_reason", "cancelled", "unfinished", "cut", "backend",
    *SERVER_TIMING_FIELDS,
)  # fmt: skip
_KINDS: dict[str, Kind] = {
    "ForeignKey": "int", "PositiveIntegerField": "int", "IntegerField": "int", "BigIntegerField": "int",
    "BooleanField": "bool", "CharField": "text", "TextField": "text", "JSONField": "gaps",
}  # fmt: skip


_KIND_ORDER: dict[Kind, int] = {"int": 0, "bool": 0, "text": 1, "gaps": 2}


def _copy_columns() -> tuple[tuple[str, Kind, bool], ...]:
    """How each COPY column is written, read off the model's fields so that a column added to
    the model is encoded by its type, and a type the encoder does not know fails at import.
    The integers and booleans come first, together: copy_text formats them in one go
    (apps/runs/copy_text.py); the COPY names its columns, so their order is ours."""
    fields = {f.column: f for f in RequestRecord._meta.concrete_fields}
    columns = [
        (name, _KINDS[fields[name].get_internal_type()], bool(fields[name].null)) for name in _RECORD_COLUMNS
    ]
    return tuple(sorted(columns, key=lambda c: _KIND_ORDER[c[1]]))


_COPY_COLUMNS = _copy_columns()
# The server's timings are joined onto the records after the run (records_server_timings_ingest),
# so a replay's batch has none: such a batch leaves their columns out of the COPY, and the table
# fills them with NULL (their columns have no default). Seven columns fewer to format and parse
# was an eighth of a batch's time (bench/results/ingest.md, 2026-12-04, evening).
_UNTIMED_COLUMNS = tuple(c for c in _COPY_COLUMNS if c[0] not in SERVER_TIMING_FIELDS)
_timings = attrgetter(*SERVER_TIMING_FIELDS)
_NO_TIMINGS = (None,) * len(SERVER_TIMING_FIELDS)
if len(SERVER_TIMING_FIELDS) < 2 or not all(
    null for n, _k, null in _COPY_COLUMNS if n in SERVER_TIMING_FIELDS
):
    raise ImproperlyConfigured("the server's timings must be two or more nullable columns")


def _batch_columns(records: Sequence[Observed]) -> tuple[tuple[str, Kind, bool], ...]:
    """The COPY's columns for this batch: all of them, or all but the server's timings where no
    record of the batch has one."""
    return _UNTIMED_COLUMNS if all(map(_NO_TIMINGS.__eq__, map(_timings, records))) else _COPY_COLUMNS


# Records per COPY write: small enough that the server is busy with one while the next is built,
# large enough that a write's own cost stays small (bench/results/ingest.md, 2026-12-04).
_COPY_CHUNK = 100


def _row(run_pk: int, rec: Observed) -> dict[str, Any]:
    return {
        "run_id": run_pk,
        "index": rec.index,
        "request_class": rec.request_class,
        "warmup": rec.warmup,
        "priority": rec.priority,
        "input_tokens": rec.input_tokens,
        "expected_output_tokens": rec.expected_output_tokens,
        "planned_ns": rec.planned_ns,
        "sent": rec.sent,
        "sent_ns": rec.sent_ns,
        "admission_delay_ns": rec.admission_delay_ns,
        "first_token_ns": rec.first_token_ns,
        "last_token_ns": rec.last_token_ns,
        "end_ns": rec.end_ns,
        "output_tokens": rec.output_tokens,
        "prompt_tokens": rec.prompt_tokens,
        "chunks": rec.chunks,
        "max_gap_ns": rec.max_gap_ns,
        "chunk_gaps": rec.chunk_gaps.to_json(),
        "token_gaps": rec.token_gaps.to_json(),
        "http_status": rec.http_status,
        "error_kind": rec.error_kind,
        "error": rec.error,
        "finish_reason": rec.finish_reason,
        "cancelled": rec.cancelled,
        "unfinished": rec.unfinished,
        "cut": rec.cut,
        "backend": rec.backend,
        **{name: getattr(rec, name) for name in SERVER_TIMING_FIELDS},
    }


_ACCEPTING_SQL = (
    f'SELECT r."kind", r."status", r."experiment_id", e."status" FROM "{Run._meta.db_table}" r '  # noqa: S608 - names are ours
    f'JOIN "{Experiment._meta.db_table}" e ON e."id" = r."experiment_id" WHERE r."id" = %s'
)


def _accepting(run_pk: int) -> bool:
    """Whether the run is done already; raise RunsRefused when the run's experiment takes no more
    records of this run's kind, Run.DoesNotExist when there is no such run.

    One query per batch (the two ORM queries it took before were a tenth of a batch's time:
    bench/results/ingest.md, 2026-12-04). The experiment is read without a lock: a run still
    writing is unfinished, and no experiment is analysed while a run is unfinished, so this
    catches a run that outlived its experiment's decision (a worker that was given up for lost
    and came back).

    On Postgres the run's row is locked ``FOR KEY SHARE`` until the caller's transaction ends,
    the lock a foreign key's check takes: the records' foreign key has no per-row check on the
    database (migration runs/0019), and this one lock per batch, with the run's delete guard,
    keeps what the check kept: no record of a run that does not exist."""
    sql = _ACCEPTING_SQL + (" FOR KEY SHARE OF r" if connection.vendor == "postgresql" else "")
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_pk])
        row = cursor.fetchone()
    if row is None:
        raise Run.DoesNotExist(f"run {run_pk} does not exist")
    kind, status, experiment_id, experiment_status = row
    runs_refuse(experiment_id, experiment_status, kind)
    return status == Run.Status.DONE


def _digest_dropped(run_pk: int, done: bool) -> None:
    """A record written to a run already done (a worker given up for lost that came back): the
    run's digest no longer packs every record, so it goes; the report packs it again."""
    if done:
        RunDigest.objects.filter(run_id=run_pk).delete()


def records_ingest(*, run_pk: int, records: Sequence[Observed]) -> int:
    """Store a batch of observed records for one run; returns how many were new.

    One transaction (a savepoint inside a caller's): the run's row locked (``_accepting``), the
    records, the run's digest dropped where the run was done. Refused (RunsRefused) when the
    run's experiment takes no more records (Experiment.assert_accepts_runs).
    """
    if not records:
        return 0
    if connection.vendor == "postgresql":
        return _records_copy(run_pk, records)
    with transaction.atomic():
        done = _accepting(run_pk)
        before = RequestRecord.objects.filter(run_id=run_pk).count()
        RequestRecord.objects.bulk_create(
            [RequestRecord(**_row(run_pk, r)) for r in records], ignore_conflicts=True, batch_size=500
        )
        new = RequestRecord.objects.filter(run_id=run_pk).count() - before
        _digest_dropped(run_pk, done and new > 0)
    return new


def _records_copy(run_pk: int, records: Sequence[Observed]) -> int:
    """COPY the batch straight into the table: a new batch (nearly every batch) is written once,
    in one transaction and no savepoint. A batch holding a row already stored (a retry after a
    killed worker) breaks the unique (run, index) constraint; the transaction is rolled back,
    nothing of it kept, and a second one sends the same text through a temporary table and
    ``ON CONFLICT DO NOTHING`` instead.

    The batch goes in chunks (apps/runs/copy_text.py), each sent as soon as it is built, so the
    server parses and indexes one chunk while this process builds the next (two processes, two
    cores); a chunk is kept until the COPY is through, for the fallback, which builds whatever
    the failed COPY left unbuilt."""
    from psycopg.errors import UniqueViolation  # Postgres only: the raw cursor's own error

    columns = _batch_columns(records)
    names = tuple(name for name, _kind, _null in columns)
    table, quoted = RequestRecord._meta.db_table, ", ".join(f'"{c}"' for c in names)
    constants = {"run_id": str(int(run_pk))}
    chunks = (
        copy_text(columns, records[i : i + _COPY_CHUNK], constants)
        for i in range(0, len(records), _COPY_CHUNK)
    )
    sent: list[str] = []
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            done = _accepting(run_pk)
            with cursor.cursor.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:  # names are ours
                for text in chunks:
                    sent.append(text)
                    copy.write(text)
            _digest_dropped(run_pk, done)
            return len(records)
    except (IntegrityError, UniqueViolation):
        pass  # a row of this batch is stored already: the transaction is gone, and with it the batch
    with transaction.atomic():
        done = _accepting(run_pk)
        new = _copy_via_temp_table(table, names, [*sent, *chunks], ("run_id", "index"))
        _digest_dropped(run_pk, done and new > 0)
    return new


def _copy_via_temp_table(
    table: str, columns: Sequence[str], chunks: Sequence[str], conflict: Sequence[str]
) -> int:
    """COPY into a temporary table, then one INSERT ... ON CONFLICT DO NOTHING: the rows not yet
    stored, each once. Inside the caller's transaction (``_records_copy``)."""
    quoted = ", ".join(f'"{c}"' for c in columns)
    with connection.cursor() as cursor:
        # A column-only copy of the table: no identity, no constraints, dropped at commit.
        # Inside an outer transaction (a test, a caller's atomic block) the table from
        # an earlier batch is still there: ON COMMIT DROP only fires at the outer commit.
        cursor.execute("DROP TABLE IF EXISTS pg_temp.tt_ingest")
        create = f"CREATE TEMP TABLE tt_ingest ON COMMIT DROP AS SELECT {quoted} FROM {table} WITH NO DATA"  # noqa: S608 - names are ours
        cursor.execute(create)
        raw = cursor.cursor  # the psycopg 3 cursor under Django's wrapper
        with raw.copy(f"COPY tt_ingest ({quoted}) FROM STDIN") as copy:
            for text in chunks:
                copy.write(text)
        keys = ", ".join(f'"{c}"' for c in conflict)
        cursor.execute(
            f"INSERT INTO {table} ({quoted}) SELECT {quoted} FROM tt_ingest ON CONFLICT ({keys}) DO NOTHING"  # noqa: S608
        )
        return cursor.rowcount


def records_server_timings_ingest(*, run_pk: int, records: Sequence[Observed]) -> int:
    """Write the server's timings of records already stored (``server_*_ns``, joined from the
    server's spans after the run: workers/engine/spans.py) onto their rows, by (run, index);
    returns how many rows changed. Refused (RunsRefused) like :func:`records_ingest`.

    Postgres: the timings are COPYed into a temporary table and applied in one UPDATE ... FROM;
    SQLite: bulk_update.
    """
    timed = [r for r in records if any(getattr(r, name) is not None for name in SERVER_TIMING_FIELDS)]
    if not timed:
        return 0
    done = _accepting(run_pk)
    try:
        if connection.vendor != "postgresql":
            rows = {
                row.index: row
                for row in RequestRecord.objects.filter(run_id=run_pk, index__in=[r.index for r in timed])
            }
            changed = []
            for rec in timed:
                row = rows.get(rec.index)
                if row is not None:
                    for name in SERVER_TIMING_FIELDS:
                        setattr(row, name, getattr(rec, name))
                    changed.append(row)
            RequestRecord.objects.bulk_update(changed, list(SERVER_TIMING_FIELDS), batch_size=500)
            return len(changed)
        columns = ("index", *SERVER_TIMING_FIELDS)
        quoted = ", ".join(f'"{c}"' for c in columns)
        table = RequestRecord._meta.db_table
        assignments = ", ".join(f'"{c}" = t."{c}"' for c in SERVER_TIMING_FIELDS)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS pg_temp.tt_timings")
            cursor.execute(
                f"CREATE TEMP TABLE tt_timings ON COMMIT DROP AS SELECT {quoted} FROM {table} WITH NO DATA"  # noqa: S608 - names are ours
            )
            with cursor.cursor.copy(f"COPY tt_timings ({quoted}) FROM STDIN") as copy:
                for rec in timed:
                    copy.write_row([getattr(rec, c) for c in columns])
            cursor.execute(
                f'UPDATE {table} AS r SET {assignments} FROM tt_timings AS t WHERE r."run_id" = %s AND r."index" = t."index"',  # noqa: S608
                [run_pk],
            )
            return cursor.rowcount
    finally:
        _digest_dropped(run_pk, done)


def records_writer(*, run_pk: int) -> Callable[[Sequence[Observed]], None]:
    """The replay's ``on_batch`` for one run: store each batch and count what was sent.

    It runs on the replay's batch thread, so it closes that thread's database connection
    after each batch.
    """
    sent = 0

    def on_batch(batch: Sequence[Observed]) -> None:
        nonlocal sent
        try:
            records_ingest(run_pk=run_pk, records=batch)
            sent += sum(1 for r in batch if r.sent)
            Run.objects.filter(pk=run_pk).update(requests_sent=sent, updated_at=timezone.now())
        finally:
            close_old_connections()

    return on_batch


def metric_samples_ingest(*, run_pk: int, samples: Sequence[dict[str, Any]], server: str = "") -> int:
    """Store scraped /metrics samples (dicts with MetricSample's field names).

    ``server`` says whose: "" the run's own server, "b0" a rehearsal's standby B0. Refused
    (RunsRefused) like :func:`records_ingest`.
    """
    _accepting(run_pk)
    objs = [
        MetricSample(
            run_id=run_pk,
            server=server,
            t_ns=s["t_ns"],
            phase=s["phase"],
            epoch=s.get("epoch", 0),
            name=s["name"],
            labels=s.get("labels") or {},
            kind=s["kind"],
            value=s.get("value"),
            histogram=s.get("histogram"),
        )
        for s in samples
    ]
    MetricSample.objects.bulk_create(objs, batch_size=1000)
    return len(objs)
