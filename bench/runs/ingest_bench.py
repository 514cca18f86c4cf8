"""Records ingested per second on their own: the worker's path (``records_ingest``) against the
temporary-table path it used before, the records generated before the clock starts.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench SECRET_KEY=bench \\
        .venv/bin/python bench/runs/ingest_bench.py [--records 200000] [--batch 1000] [--repeat 3] [--smoke]

One small experiment (tests/experiments/factories.make_experiment) in the database the
environment selects; each mode writes the same records, in batches of ``--batch`` as the replay
hands them to the worker, into a run emptied first, ``--repeat`` times; the median is printed:

- ``records_ingest``: COPY straight into the table inside a savepoint (apps/runs/ingest.py), the
  temporary-table path only for a batch holding a row already stored;
- ``temp table + ON CONFLICT``: every batch through a temporary table and
  ``INSERT ... ON CONFLICT DO NOTHING`` (the path every batch took before);
- ``retried batches``: every batch written twice, the second time by ``records_ingest`` (all its
  rows stored already: the fallback's worst case), counting both writes.

On SQLite (the embedded default) ``records_ingest`` is bulk_create and the peer is skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from apps.runs import ingest  # noqa: E402
from apps.runs.models import RequestRecord, Run  # noqa: E402
from tests.experiments.factories import make_experiment  # noqa: E402
from tests.runs.factories import observed  # noqa: E402
from workers.replay.records import RequestRecord as Observed  # noqa: E402


def temp_table(run_pk: int, batch: Sequence[Observed]) -> int:
    rows = [ingest._row(run_pk, r) for r in batch]
    return ingest._copy_via_temp_table(
        RequestRecord._meta.db_table, ingest._RECORD_COLUMNS, rows, ("run_id", "index")
    )


def retried(run_pk: int, batch: Sequence[Observed]) -> int:
    ingest.records_ingest(run_pk=run_pk, records=batch)
    return ingest.records_ingest(run_pk=run_pk, records=batch)


def timed(run: Run, batches: list[list[Observed]], write: Callable[[int, Sequence[Observed]], int]) -> float:
    RequestRecord.objects.filter(run=run).delete()
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
        modes["temp table + ON CONFLICT"] = temp_table
    modes["retried batches (each written twice)"] = retried
    print(
        f"{connection.vendor}: {args.records:,} records in batches of {args.batch:,}, median of {args.repeat}"
    )
    rates: dict[str, float] = {}
    for name, write in modes.items():
        took = statistics.median(timed(run, batches, write) for _ in range(max(1, args.repeat)))
        rates[name] = args.records / took
        print(f"{name}: {took:.2f} s, {rates[name]:,.0f} records/s")
    if "temp table + ON CONFLICT" in rates:
        print(
            f"ratio records_ingest / temp table: {rates['records_ingest'] / rates['temp table + ON CONFLICT']:.2f}x"
        )
    run.experiment.delete()
    return rates


if __name__ == "__main__":
    main()
