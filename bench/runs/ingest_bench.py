"""Records ingested per second on their own: the worker's path (``records_ingest``) against the
temporary-table path it used before, the records generated before the clock starts.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench SECRET_KEY=bench \\
        .venv/bin/python bench/runs/ingest_bench.py [--records 200000] [--batch 1000] [--repeat 3] [--smoke]

One small experiment (tests/experiments/factories.make_experiment) in the database the
environment selects; each mode writes the same records, in batches of ``--batch`` as the replay
hands them to the worker, into a run emptied (and the table vacuumed, so that no dead row of an
earlier pass sits under the same keys) before the clock starts, ``--repeat`` times, the modes
taking turns so that a shared machine's load falls on each alike; the median is printed, with the
median CPU seconds of this process and (a server on this machine) of the server's process:

- ``records_ingest``: the batch as one COPY text (apps/runs/copy_text.py), COPYed straight into
  the table inside a savepoint (apps/runs/ingest.py), the temporary-table path only for a batch
  holding a row already stored;
- ``previous records_ingest``: the same savepoint and fallback, the rows fed the way the ingest
  fed them until 2026-12-04: a dict per record, ``json.dumps`` of its two gap histograms,
  psycopg's ``copy.write_row`` per row (kept here, not in apps/, as the peer of this run);
- ``temp table + ON CONFLICT``: every batch through a temporary table and
  ``INSERT ... ON CONFLICT DO NOTHING``, rows fed as the previous ingest fed them (the path
  every batch took before the savepoint);
- ``records_ingest + per-row foreign key check``: ``records_ingest`` with the records' foreign key
  constraint put back on the database for the pass (``DEFERRABLE INITIALLY DEFERRED``, as
  Django made it until migration runs/0019), the schema's peer: the check is one query per row;
- ``retried batches``: every batch written twice, the second time by ``records_ingest`` (all its
  rows stored already: the fallback's worst case), counting both writes.

``--gaps N``: each record's gap histograms filled from N gaps (log-normal around 22 ms, sigma
0.5, one to three tokens a chunk, seeded) instead of the factory's single bucket: 128 such gaps
fall into about fifty buckets of 4%, and both sides of the COPY pay per bucket.

On SQLite (the embedded default) ``records_ingest`` is bulk_create and the peer is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import IntegrityError, connection, transaction  # noqa: E402

from apps.runs import ingest  # noqa: E402
from apps.runs.models import RequestRecord, Run  # noqa: E402
from tests.experiments.factories import make_experiment  # noqa: E402
from tests.runs.factories import observed  # noqa: E402
from workers.replay.records import GapHistogram  # noqa: E402
from workers.replay.records import RequestRecord as Observed  # noqa: E402


def _write_rows(copy: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Rows as the ingest wrote them before 2026-12-04: one list per row, adapted by psycopg."""
    for row in rows:
        copy.write_row(
            [
                json.dumps(row[c]) if c in ("chunk_gaps", "token_gaps") else row[c]
                for c in ingest._RECORD_COLUMNS
            ]
        )


def _via_temp_table(rows: Sequence[dict[str, Any]]) -> int:
    table, quoted = RequestRecord._meta.db_table, ", ".join(f'"{c}"' for c in ingest._RECORD_COLUMNS)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS pg_temp.tt_ingest")
        cursor.execute(
            f"CREATE TEMP TABLE tt_ingest ON COMMIT DROP AS SELECT {quoted} FROM {table} WITH NO DATA"  # noqa: S608 - names are ours
        )
        with cursor.cursor.copy(f"COPY tt_ingest ({quoted}) FROM STDIN") as copy:
            _write_rows(copy, rows)
        cursor.execute(
            f"INSERT INTO {table} ({quoted}) SELECT {quoted} FROM tt_ingest ON CONFLICT (run_id, index) DO NOTHING"  # noqa: S608
        )
        return cursor.rowcount


def previous(run_pk: int, batch: Sequence[Observed]) -> int:
    from psycopg.errors import UniqueViolation

    ingest._accepting(run_pk)
    rows = [ingest._row(run_pk, r) for r in batch]
    table, quoted = RequestRecord._meta.db_table, ", ".join(f'"{c}"' for c in ingest._RECORD_COLUMNS)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            with cursor.cursor.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                _write_rows(copy, rows)
            return len(rows)
    except (IntegrityError, UniqueViolation):
        pass
    return _via_temp_table(rows)


def temp_table(run_pk: int, batch: Sequence[Observed]) -> int:
    return _via_temp_table([ingest._row(run_pk, r) for r in batch])


def retried(run_pk: int, batch: Sequence[Observed]) -> int:
    ingest.records_ingest(run_pk=run_pk, records=batch)
    return ingest.records_ingest(run_pk=run_pk, records=batch)


def _server_cpu() -> float | None:
    """CPU seconds the connection's server process has used, where the server runs on this
    machine (its /proc is readable); None elsewhere. On a shared machine the wall clock counts
    the other sessions' load too; the CPU each side spent does not."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def with_gaps(records: list[Observed], gaps: int) -> None:
    rng = random.Random(38)
    for rec in records:
        rec.chunk_gaps, rec.token_gaps = GapHistogram(), GapHistogram()
        for _ in range(gaps):
            gap_us, tokens = rng.lognormvariate(10, 0.5), rng.choice((1, 1, 2, 3))
            rec.chunk_gaps.add(gap_us)
            rec.token_gaps.add(gap_us / tokens, tokens)


_FOREIGN_KEY = "bench_records_run_checked"


def _due_checks_fired(cursor: Any) -> None:
    """Inside a transaction (the smoke test) the deferred checks due so far fire now: a table
    with checks pending cannot be altered."""
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cursor.execute("SET CONSTRAINTS ALL DEFERRED")


@contextmanager
def per_row_check() -> Iterator[None]:
    """The records' foreign key constraint on the database for one pass, as Django made it before
    migration runs/0019 (NOT VALID: the rows stored already are not checked, new rows are)."""
    table, runs = RequestRecord._meta.db_table, Run._meta.db_table
    with connection.cursor() as cursor:
        _due_checks_fired(cursor)
        cursor.execute(
            f'ALTER TABLE "{table}" ADD CONSTRAINT "{_FOREIGN_KEY}" FOREIGN KEY ("run_id") '
            f'REFERENCES "{runs}" ("id") DEFERRABLE INITIALLY DEFERRED NOT VALID'
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            _due_checks_fired(cursor)
            cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{_FOREIGN_KEY}"')


def timed(
    run: Run,
    batches: list[list[Observed]],
    write: Callable[[int, Sequence[Observed]], int],
    schema: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> tuple[float, float, float | None]:
    """Wall seconds, this process's CPU seconds and the server process's CPU seconds of one pass."""
    RequestRecord.objects.filter(run=run).delete()
    if connection.vendor == "postgresql" and not connection.in_atomic_block:  # the smoke test's is
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM {RequestRecord._meta.db_table}")
    with schema():
        server0, cpu0, t0 = _server_cpu(), time.process_time(), time.perf_counter()
        for batch in batches:
            write(run.pk, batch)
        took, cpu, server1 = time.perf_counter() - t0, time.process_time() - cpu0, _server_cpu()
    assert RequestRecord.objects.filter(run=run).count() == sum(len(b) for b in batches)
    return took, cpu, None if server0 is None or server1 is None else server1 - server0


_CHECKED = "records_ingest + per-row foreign key check"


def reference_loop(n: int = 5_000_000) -> float:
    """CPU seconds of a fixed pure-Python loop, none of the code measured here: this VM's speed
    drifts by a third or more within an hour, and the loop's time says which speed a run had."""
    cpu, total = time.process_time(), 0
    for i in range(n):
        total += i
    return time.process_time() - cpu


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--gaps", type=int, default=0, help="token gaps per record's histograms (0: the factory's)"
    )
    parser.add_argument("--smoke", action="store_true", help="2,000 records once (the suite's check)")
    parser.add_argument("--no-migrate", action="store_true", help="the database is migrated already (tests)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.records, args.repeat = 2_000, 1
    if not args.no_migrate:
        call_command("migrate", verbosity=0)
    run = make_experiment().runs.first()
    assert run is not None
    records = [observed(str(run.run_id), i) for i in range(args.records)]  # before any clock
    if args.gaps:
        with_gaps(records, args.gaps)
    batches = [records[i : i + args.batch] for i in range(0, len(records), args.batch)]
    modes: dict[str, Callable[[int, Sequence[Observed]], int]] = {
        "records_ingest": lambda pk, b: ingest.records_ingest(run_pk=pk, records=b)
    }
    schemas: dict[str, Callable[[], AbstractContextManager[None]]] = {}
    if connection.vendor == "postgresql":
        modes["previous records_ingest"] = previous
        modes["temp table + ON CONFLICT"] = temp_table
        modes[_CHECKED] = modes["records_ingest"]
        schemas[_CHECKED] = per_row_check
    modes["retried batches (each written twice)"] = retried
    buckets = statistics.mean(len(r.token_gaps.counts) + len(r.chunk_gaps.counts) for r in records) / 2
    print(
        f"{connection.vendor}: {args.records:,} records in batches of {args.batch:,}, median of {args.repeat}"
        f", {buckets:.1f} buckets a gap histogram"
    )
    passes: dict[str, list[tuple[float, float, float | None]]] = {name: [] for name in modes}
    loops = [] if args.smoke else [reference_loop()]
    for _ in range(max(1, args.repeat)):
        for name, write in modes.items():
            passes[name].append(timed(run, batches, write, schemas.get(name, nullcontext)))
    loops += [] if args.smoke else [reference_loop()]
    if loops:
        print(f"reference loop (5M additions), before and after: {loops[0]:.2f} s, {loops[1]:.2f} s of CPU")
    rates: dict[str, float] = {}
    for name, each in passes.items():
        took = statistics.median(p[0] for p in each)
        rates[name] = args.records / took
        walls = ", ".join(f"{p[0]:.2f}" for p in each)
        cpu = f"cpu: client {statistics.median(p[1] for p in each):.2f} s"
        servers = [p[2] for p in each if p[2] is not None]
        cpu += f", server {statistics.median(servers):.2f} s" if servers else ""
        print(f"{name}: {took:.2f} s ({walls}), {rates[name]:,.0f} records/s; {cpu}")
    for peer in ("previous records_ingest", "temp table + ON CONFLICT", _CHECKED):
        if peer in rates:
            print(f"ratio records_ingest / {peer}: {rates['records_ingest'] / rates[peer]:.2f}x")
    run.experiment.delete()
    return rates


if __name__ == "__main__":
    main()
