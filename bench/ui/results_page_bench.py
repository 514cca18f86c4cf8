"""Time the results page of a 126-run, 1,000,000-record experiment against the experiment page.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench SECRET_KEY=bench \
        .venv/bin/python bench/ui/results_page_bench.py [--records 1000000] [--loads 50] [--reuse]

Seeds the seed sweep (7 cells x 3 mixtures x 2 rates x 3 repeats = 126 runs)
with synthetic records and scrapes through bench/analysis/report_bench.py's
loader, runs the real analysis once (so the Decision holds a report of
realistic size), then renders each page through Django's test client as a
logged-in user (asking for gzip, as a browser does) and reports the median
and p95 wall time over `--loads` loads, the SQL queries and the
response size. The results page draws every chart from the stored report's
aggregates, so its cost should not grow with the record count; the run page
buckets one run's records in SQL. Timings vary with the machine: the ratios
are the numbers to compare. ``--reuse`` keeps an earlier seeded experiment.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "analysis"))

import report_bench  # noqa: E402  (sets up Django)
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.auth.models import Group  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from apps.accounts.models import ApiToken  # noqa: E402
from apps.accounts.roles import VIEWER  # noqa: E402
from apps.accounts.tokens import token_create  # noqa: E402
from apps.analysis.services import experiment_analyse  # noqa: E402
from apps.experiments.models import Experiment  # noqa: E402
from apps.lifecycle.creation import experiment_create  # noqa: E402
from apps.runs.models import RequestRecord  # noqa: E402

NAME = "bench-ui"


def seed(records: int, *, smoke: bool = False) -> Experiment:
    Experiment.objects.filter(name=NAME).delete()
    user, _ = get_user_model().objects.get_or_create(username="bench-ui")
    experiment = experiment_create(spec=report_bench.sweep_spec(NAME, user.username, smoke=smoke), owner=user)
    t0 = time.perf_counter()
    report_bench.load(experiment, records)
    print(f"seeded {records:,} records in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    experiment_analyse(experiment_id=experiment.pk)
    print(f"analysed in {time.perf_counter() - t0:.1f} s", flush=True)
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.ANALYSED)
    return Experiment.objects.get(pk=experiment.pk)


def measure(client: Client, url: str, loads: int, **headers: str) -> dict[str, float]:
    client.get(url, **headers)  # warm: templates compiled, connection open
    times = []
    for _ in range(loads):
        with CaptureQueriesContext(connection) as queries:
            t0 = time.perf_counter()
            response = client.get(url, **headers)
            times.append(time.perf_counter() - t0)
        assert response.status_code == 200, (url, response.status_code, response.content[:200])
    ordered = sorted(times)
    return {
        "median_ms": statistics.median(times) * 1000,
        "p95_ms": ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] * 1000,
        "min_ms": min(times) * 1000,
        "queries": len(queries.captured_queries),
        "kib": len(response.content) / 1024,
        "gzip": response.get("Content-Encoding") == "gzip",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--loads", type=int, default=50, help="loads of each page (median and p95 of them)")
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="8 runs, 400 records, 2 loads: the suite's check"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.records, args.loads = 400, 2

    experiment = Experiment.objects.filter(name=NAME).first() if args.reuse else None
    if experiment is None:
        experiment = seed(args.records, smoke=args.smoke)
    records = RequestRecord.objects.filter(run__experiment=experiment).count()
    report = experiment.decision.report
    admin, _ = get_user_model().objects.get_or_create(username="bench-ui-admin", is_superuser=True)
    client = Client()
    client.force_login(admin)
    # The API's report as a release pipeline reads it: a viewer's token.
    Group.objects.get_or_create(name=VIEWER)[0].user_set.add(admin)
    ApiToken.objects.filter(user=admin, name="bench-ui").delete()
    _, token = token_create(user=admin, name="bench-ui")
    run = experiment.runs.order_by("plan_position").first()
    pages = {
        "experiment page": f"/experiments/{experiment.pk}/",
        "live partial": f"/experiments/{experiment.pk}/live/",
        "results page": f"/experiments/{experiment.pk}/results/",
        "run page": f"/runs/{run.run_id}/",
        "experiment list": "/",
    }
    # What config/wsgi.py does once the served application is loaded: what was loaded so far is
    # left out of every later collection (the test client does not go through wsgi.py).
    gc.collect()
    gc.freeze()
    # As a browser asks for them: compressed where the page may be (the results page, the report).
    out = {name: measure(client, url, args.loads, HTTP_ACCEPT_ENCODING="gzip") for name, url in pages.items()}
    out["API report (JSON)"] = measure(
        client,
        f"/api/v1/experiments/{experiment.pk}/report",
        args.loads,
        HTTP_ACCEPT_ENCODING="gzip",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    base = out["experiment page"]["median_ms"]
    print(f"\n{connection.vendor}, {experiment.runs.count()} runs, {records:,} request records, "
          f"report {len(json.dumps(report)) / 1024:.0f} KiB (JSON)")  # fmt: skip
    print(f"{args.loads} loads a page")
    print(f"{'page':18} {'median ms':>10} {'p95 ms':>8} {'min ms':>8} {'x exp. page':>11} {'queries':>8} "
          f"{'KiB sent':>9} {'gzip':>5}")  # fmt: skip
    for name, m in out.items():
        print(
            f"{name:18} {m['median_ms']:10.1f} {m['p95_ms']:8.1f} {m['min_ms']:8.1f} {m['median_ms'] / base:11.2f} "
            f"{m['queries']:8d} {m['kib']:9.0f} {'yes' if m['gzip'] else 'no':>5}"
        )


if __name__ == "__main__":
    main()
