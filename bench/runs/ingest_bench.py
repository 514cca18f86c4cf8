"""Records ingested per second on their own: the worker's path (``records_ingest``) against the
temporary-table path it used before, the records generated before the clock starts.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench SECRET_KEY=bench \\
        .venv/bin/python bench/runs/ingest_bench.py [--records 200000] [--batch 1000] [--repeat 3] [--smoke]

One small experiment (tests/experiments/factories.make_experiment) in the database the
environment selects; each mode writes the same records, in batches of ``--batch`` as the replay
hands them to the worker, into a run emptied (and the table vacuumed, so that no dead row of an
earlier pass sits under the same keys) before the clock starts, ``--repeat`` times, the modes
taking turns so that a shared machine's load falls on each alike; the median is printed:

- ``records_ingest``: the batch as one COPY text (apps/runs/copy_text.py), COPYed straight into
  the table inside a savepoint (apps/runs/ingest.py), the temporary-table path only for a batch
  holding a row already stored;
- ``previous records_ingest``: the same savepoint and fallback, the rows fed the way the ingest
  fed them until 2026-12-04: a dict per record, ``json.dumps`` of its two gap histograms,
  psycopg's ``copy.write_row`` per row (kept here, not in apps/, as the peer of this run);
- ``temp table + ON CONFLICT``: every batch through a temporary table and
  ``INSERT ... ON CONFLICT DO NOTHING``, rows fed as the previous ingest fed them (the path
  every batch took before the savepoint);
- ``retried batches``: every batch written twice, the second time by ``records_ingest`` (all its
  rows stored already: the fallback's worst case), counting both writes.

On SQLite (the embedded default) ``records_ingest`` is bulk_create and the peer is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
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


def timed(run: Run, batches: list[list[Observed]], write: Callable[[int, Sequence[Observed]], int]) -> float:
    RequestRecord.objects.filter(run=run).delete()
    if connection.vendor == "postgresql" and not connection.in_atomic_block:  # the smoke test's is
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM {RequestRecord._meta.db_table}")
    t0 = time.perf_counter()
    for batch in batches:
        write(run.pk, batch)
    took = time.perf_counter() - t0
    assert RequestRecord.objects.filter(run=run).count() == sum(len(b) for b in batches)
    return took


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
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
    batches = [records[i : i + args.batch] for i in range(0, len(records), args.batch)]
    modes: dict[str, Callable[[int, Sequence[Observed]], int]] = {
        "records_ingest": lambda pk, b: ingest.records_ingest(run_pk=pk, records=b)
    }
    if connection.vendor == "postgresql":
        modes["previous records_ingest"] = previous
        modes["temp table + ON CONFLICT"] = temp_table
    modes["retried batches (each written twice)"] = retried
    print(
        f"{connection.vendor}: {args.records:,} records in batches of {args.batch:,}, median of {args.repeat}"
    )
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(max(1, args.repeat)):
        for name, write in modes.items():
            times[name].append(timed(run, batches, write))
    rates: dict[str, float] = {}
    for name, took in times.items():
        rates[name] = args.records / statistics.median(took)
        each = ", ".join(f"{t:.2f}" for t in took)
        print(f"{name}: {statistics.median(took):.2f} s ({each}), {rates[name]:,.0f} records/s")
    for peer in ("previous records_ingest", "temp table + ON CONFLICT"):
        if peer in rates:
            print(f"ratio records_ingest / {peer}: {rates['records_ingest'] / rates[peer]:.2f}x")
    run.experiment.delete()
    return rates


if __name__ == "__main__":
    main()
