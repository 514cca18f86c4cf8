"""Time experiment_report on a 126-run experiment holding 1,000,000 request records.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tailtune_bench SECRET_KEY=bench \
        .venv/bin/python bench/analysis/report_bench.py [--records 1000000] [--skip-naive] \
        [--reuse] [--repeat 3] [--save-report FILE] [--profile FILE] [--smoke]

Creates the seed sweep (examples/seed-sweep.yaml: 7 cells x 3 mixtures x 2
rates x 3 repeats = 126 runs) in the database the environment selects, marks
every run done on one shared trace per (mixture, rate, repeat), bulk-loads
synthetic records (COPY on Postgres, executemany on SQLite) plus a few metric
samples per run, then times:

1. experiment_report_build (what `manage.py experiment_report` runs), by phase;
2. the peer: a naive per-record Python loop over model instances computing
   only the per-run, per-class percentiles, goodput and merged ITL histogram
   (a strict subset of the report's work).

The database is wiped of earlier bench experiments first. Timings vary with
the machine; the ratio is the number to compare.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import resource
import statistics
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

import yaml  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from apps.analysis import run_digest, services  # noqa: E402
from apps.analysis.report_types import Report  # noqa: E402
from apps.experiments.models import Experiment  # noqa: E402
from apps.lifecycle.creation import experiment_create  # noqa: E402
from apps.runs.models import MetricSample, Run  # noqa: E402
from apps.runs.models import RequestRecord as RecordRow  # noqa: E402
from workers.replay.records import GapHistogram, _bucket  # noqa: E402

COLUMNS = (
    "run_id", "index", "request_class", "warmup", "priority", "input_tokens", "expected_output_tokens",
    "planned_ns", "sent", "sent_ns", "admission_delay_ns", "first_token_ns", "last_token_ns", "end_ns",
    "output_tokens", "prompt_tokens", "chunks", "max_gap_ns", "chunk_gaps", "token_gaps", "http_status",
    "error_kind", "error", "finish_reason", "cancelled", "unfinished",
)  # fmt: skip


def _later_columns() -> tuple[tuple[str, ...], tuple[object, ...]]:
    """Every other record column with its model default, so a column added to RequestRecord
    later (the rehearsal's ``cut`` and ``backend``, the server timings) never breaks the COPY:
    the database has no defaults of its own for them (Django keeps defaults in Python)."""
    names, values = [], []
    for f in RecordRow._meta.concrete_fields:
        if f.primary_key or f.column in COLUMNS:
            continue
        value = f.get_default()
        names.append(f.column)
        values.append(json.dumps(value) if isinstance(value, (dict, list)) else value)
    return tuple(names), tuple(values)


def sweep_spec(name: str, owner: str, *, smoke: bool = False) -> dict:
    """examples/seed-sweep.yaml as this bench has always timed it: the sweep's 126 runs only (the
    reference sweep's failure scenarios, uniform companions, calibration and rehearsal are other
    work, and their runs are not loaded). ``smoke``: B0 and C1 on the 80-20 mixture, two repeats
    (8 runs), for the suite's smoke run (tests/bench/test_bench_smoke.py)."""
    spec = yaml.safe_load((ROOT / "examples" / "seed-sweep.yaml").read_text())
    spec["name"] = name
    spec["owner"] = owner
    for part in ("scenarios", "calibration", "recovery"):
        spec.pop(part, None)
    spec["workload"]["uniform_companion"] = False
    if smoke:
        spec["candidates"] = spec["candidates"][:1]
        spec["workload"]["mixtures"] = {"80-20": spec["workload"]["mixtures"]["80-20"]}
        spec["workload"]["repeats"] = 2
    return spec


def create_experiment(*, smoke: bool = False) -> Experiment:
    Experiment.objects.filter(name__startswith="bench-analysis").delete()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    return experiment_create(spec=sweep_spec("bench-analysis", "bench", smoke=smoke), owner=user)


def run_rows(run: Run, n: int, cell_pos: int, weights: dict[str, float], seed: int) -> list[tuple]:
    """Synthetic records of one run: the trace (classes, arrivals) depends only on `seed`."""
    trace = np.random.default_rng(seed)
    names = sorted(weights)
    probs = np.asarray([weights[k] for k in names]) / sum(weights.values())
    cls = trace.choice(len(names), size=n, p=probs)
    planned = np.sort(trace.uniform(0, run.warmup_seconds + run.observation_seconds, n) * 1e9).astype(
        np.int64
    )
    noise = np.random.default_rng(seed * 31 + cell_pos)
    long = np.asarray([names[c] == "long" for c in cls])
    ttft = np.where(
        long, noise.lognormal(np.log(900), 0.5, n), noise.lognormal(np.log(120 + 10 * cell_pos), 0.6, n)
    )
    itl = noise.normal(20 + cell_pos, 2, n).clip(5)
    status = np.where(noise.random(n) < 0.004, 503, 200)
    unfinished = long & (noise.random(n) < 0.002) & (status == 200)
    spread = noise.multinomial(127, [0.25, 0.45, 0.2, 0.08, 0.02], size=n)
    rows = []
    window_start = run.warmup_seconds * 1e9
    for i in range(n):
        p = int(planned[i])
        name = names[cls[i]]
        sent = p + int(noise.integers(50_000, 400_000))
        # 127 gaps spread over five buckets around the request's own ITL, with
        # per-request weights: real histograms are rarely identical, and the
        # database must not get to cache the work away.
        b = _bucket(itl[i] * 1000.0)
        w = spread[i]
        hist = json.dumps(
            {
                str(b - 1): int(w[0]),
                str(b): int(w[1]),
                str(b + 1): int(w[2]),
                str(b + 4): int(w[3]),
                str(b + 9): int(w[4]),
            }
        )
        if status[i] != 200:
            rows.append(
                (
                    run.pk,
                    i,
                    name,
                    p < window_start,
                    0,
                    512,
                    128,
                    p,
                    True,
                    sent,
                    0,
                    None,
                    None,
                    sent + 10**6,
                    None,
                    None,
                    0,
                    None,
                    "{}",
                    "{}",
                    503,
                    "http",
                    "queue full",
                    None,
                    False,
                    False,
                )
            )
            continue
        first = p + int(ttft[i] * 1e6)
        last = first + int(127 * itl[i] * 1e6)
        done = not unfinished[i]
        rows.append(
            (
                run.pk,
                i,
                name,
                p < window_start,
                0,
                8000 if name == "long" else 512,
                128,
                p,
                True,
                sent,
                0,
                first,
                last,
                last + 200_000 if done else None,
                128 if done else None,
                512,
                128,
                int(itl[i] * 3e6),
                hist,
                hist,
                200,
                None,
                None,
                "length" if done else None,
                False,
                not done,
            )
        )
    return rows


def load(experiment: Experiment, total: int) -> None:
    runs = list(experiment.runs.select_related("cell").order_by("plan_position"))
    cells = [c.cell_id for c in experiment.cells.order_by("position")]
    mixtures = experiment.workload.mixtures
    # Every cell of a (mixture, rate, repeat) replays the same trace, so every
    # run gets the same count: ceil(total / runs), at least `total` in all.
    per_run = -(-total // len(runs))
    later, later_values = _later_columns()
    quoted = ", ".join(f'"{c}"' for c in (*COLUMNS, *later))
    table = RecordRow._meta.db_table
    for i, run in enumerate(runs):
        run.status = Run.Status.DONE
        run.trace_sha256 = f"trace-{run.mixture}-{run.rate_name}-{run.repeat}"
        run.corpus_sha256 = f"corpus-{run.mixture}-{run.rate_name}-{run.repeat}"
        run.hardware_id = "bench-cpu"
        run.dispatch_lag_p99_ms = 1.0
        run.save()
        n = per_run
        seed = zlib.crc32(f"{run.mixture}|{run.rate_name}|{run.repeat}".encode())
        rows = [
            (*row, *later_values)
            for row in run_rows(run, n, cells.index(run.cell.cell_id), mixtures[run.mixture], seed)
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                with cursor.cursor.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            else:
                marks = ", ".join(["%s"] * (len(COLUMNS) + len(later)))
                cursor.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({marks})", rows)  # noqa: S608
        samples = []
        for k in range(40):
            t = int(k * 3.5e9)
            samples.append(
                MetricSample(
                    run=run,
                    t_ns=t,
                    phase="during",
                    name="vllm:num_preemptions_total",
                    kind="counter",
                    value=float(k * (cells.index(run.cell.cell_id) % 3)),
                )
            )
            samples.append(
                MetricSample(
                    run=run,
                    t_ns=t,
                    phase="during",
                    name="vllm:num_requests_waiting",
                    kind="gauge",
                    value=float(k % 7),
                )
            )
        MetricSample.objects.bulk_create(samples)
        if (i + 1) % 21 == 0:
            print(f"loaded run {i + 1}/{len(runs)}", flush=True)


def naive(experiment: Experiment) -> int:
    """The peer: one Python pass over model instances, per-(run, class) lists, sorted percentiles."""
    runs = {r.pk: r for r in experiment.runs.all()}
    classes = {c.name: c for c in experiment.classes.all()}
    groups: dict[tuple[int, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    hists: dict[tuple[int, str], GapHistogram] = defaultdict(GapHistogram)
    for rec in RecordRow.objects.filter(run__experiment=experiment).iterator(chunk_size=10_000):
        run = runs[rec.run_id]
        start = run.warmup_seconds * 1e9
        if rec.warmup or not (start <= rec.planned_ns < start + run.observation_seconds * 1e9):
            continue
        g = groups[(rec.run_id, rec.request_class)]
        ok = rec.http_status == 200 and not rec.unfinished and rec.error_kind is None
        ttft = (rec.first_token_ns - rec.planned_ns) / 1e6 if rec.first_token_ns else math.inf
        e2e = (rec.end_ns - rec.planned_ns) / 1e6 if ok else math.inf
        g["ttft"].append(ttft)
        g["e2e"].append(e2e)
        g["stall"].append(rec.max_gap_ns / 1e6 if ok and rec.max_gap_ns else math.inf)
        c = classes[rec.request_class]
        g["good"].append(
            ok
            and rec.output_tokens == rec.expected_output_tokens
            and ttft <= c.ttft_p99_ms
            and e2e <= c.e2e_p99_ms
        )
        hists[(rec.run_id, rec.request_class)].merge(GapHistogram.from_json(rec.token_gaps))
    out = 0
    for key, g in groups.items():
        for name in ("ttft", "e2e", "stall"):
            v = sorted(g[name])
            for q in (0.5, 0.95, 0.99):
                _ = v[max(0, math.ceil(q * len(v)) - 1)]
        _ = sum(g["good"]) / runs[key[0]].observation_seconds
        _ = hists[key].quantile(0.99)
        out += 1
    return out


def timed(label: str, fn, results: dict[str, float]):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    value = fn()
    results[label] = time.perf_counter() - t0
    print(f"{label}: {results[label]:.2f} s", flush=True)
    return value


# The phases of experiment_report_build, timed inside the real call (services' own names).
PHASES = {
    "_report_records": "read the runs' records (digests)",
    "_samples": "metric samples",
    "build_report": "build_report (pure)",
}


def build_by_phase(
    experiment_id: int, *, profile: Path | None = None, direct: bool = False
) -> tuple[Report, dict[str, float], float]:
    """experiment_report_build once, with the seconds each of its phases took and the total;
    ``direct``: reading every record as before run digests (run_digest.records_read)."""
    spent: dict[str, float] = defaultdict(float)
    originals = {name: getattr(services, name) for name in PHASES}
    if direct:
        # What the report read before run digests: every record, each time.
        originals["_report_records"] = run_digest.records_read

    def wrap(name: str, fn):  # type: ignore[no-untyped-def]
        def timed_phase(*a, **kw):  # type: ignore[no-untyped-def]
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
                # This process's CPU seconds: what a loaded machine's wall clock hides (the
                # database's own work is not in it).
                spent[f"{name}:cpu"] += time.process_time() - c0

        return timed_phase

    saved = {name: getattr(services, name) for name in PHASES}
    for name, fn in originals.items():
        setattr(services, name, wrap(name, fn))
    profiler = cProfile.Profile() if profile else None
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        report = services.experiment_report_build(experiment_id=experiment_id)
        if profiler:
            profiler.disable()
        total = time.perf_counter() - t0
        spent["total:cpu"] = time.process_time() - c0
    finally:
        for name, fn in saved.items():
            setattr(services, name, fn)
    if profiler and profile:
        profiler.dump_stats(str(profile))
        pstats.Stats(str(profile)).sort_stats("cumulative").print_stats(30)
    return report, dict(spent), total


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1, help="report builds; the median is printed")
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="also time one build reading every record, as before run digests",
    )
    parser.add_argument("--reuse", action="store_true", help="time the existing bench experiment")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny run (2,520 records) that checks the bench works"
    )
    parser.add_argument("--no-migrate", action="store_true", help="the database is migrated already (tests)")
    parser.add_argument(
        "--save-report", type=Path, help="write the report as sorted JSON here (to diff two versions)"
    )
    parser.add_argument("--profile", type=Path, help="cProfile the first build into this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.records = 400
    if not args.no_migrate:
        call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor}")
    results: dict[str, float] = {}
    if args.reuse:
        experiment = Experiment.objects.get(name="bench-analysis")
    else:
        experiment = timed("create experiment", lambda: create_experiment(smoke=args.smoke), results)
        timed("load records", lambda: load(experiment, args.records), results)
        # What autovacuum does after a bulk load; without statistics the planner
        # misjudges the histogram merge (a serial plan, several times slower).
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {RecordRow._meta.db_table}")
    n = RecordRow.objects.filter(run__experiment=experiment).count()
    print(f"runs: {experiment.runs.count()}, records: {n}")
    # What the pipeline does as each run ends (workers/pipeline.py), here for all at once.
    done = services.report_rows(experiment_id=experiment.pk).done
    timed(
        f"pack run digests ({len(done)} runs, as each run ends)",
        lambda: run_digest.digests_build(done),
        results,
    )

    if args.direct:
        # The peer in the same run: the same report, every record read as before run digests.
        _, direct_spent, direct_total = build_by_phase(experiment.pk, direct=True)
        results["before digests: experiment_report_build (total)"] = direct_total
        for name, label in PHASES.items():
            print(f"before digests, phase: {label}: {direct_spent.get(name, 0.0):.2f} s")
        print(f"before digests: experiment_report_build (total): {direct_total:.2f} s")
    builds = []
    for i in range(max(1, args.repeat)):
        builds.append(build_by_phase(experiment.pk, profile=args.profile if i == 0 else None))
    totals = [b[2] for b in builds]
    middle = builds[totals.index(statistics.median_low(totals))]
    full, spent, total = middle
    for name, label in PHASES.items():
        results[f"phase: {label}"] = spent.get(name, 0.0)
        results[f"phase cpu: {label}"] = spent.get(f"{name}:cpu", 0.0)
        print(
            f"phase: {label}: {spent.get(name, 0.0):.2f} s (this process's CPU: {spent.get(f'{name}:cpu', 0.0):.2f} s)"
        )
    results["experiment_report_build (total)"] = total
    print(f"experiment_report_build, this process's CPU: {spent.get('total:cpu', 0.0):.2f} s")
    print(
        f"experiment_report_build (total): {total:.2f} s"
        + (f" (median of {len(totals)}: {', '.join(f'{t:.2f}' for t in totals)})" if len(totals) > 1 else "")
    )
    decisions = {json.dumps(b[0]["decision"], sort_keys=True, default=str) for b in builds}
    if len(decisions) != 1:
        raise SystemExit("the report's decision differs between builds of the same data")
    if args.save_report:
        args.save_report.write_text(json.dumps(full, sort_keys=True, indent=1, default=str))
    print(
        f"decision: {full['decision']['outcome']} {full['decision']['chosen_cell']}; "
        f"comparisons: {len(full['comparisons'])}; report JSON: {len(json.dumps(full)) / 1e6:.1f} MB"
    )
    if not args.skip_naive:
        c0 = time.process_time()
        timed("peer: naive per-record loop (per-run metrics only)", lambda: naive(experiment), results)
        print(f"peer, this process's CPU: {time.process_time() - c0:.2f} s")
        ratio = (
            results["peer: naive per-record loop (per-run metrics only)"]
            / results["experiment_report_build (total)"]
        )
        print(f"ratio naive / experiment_report_build: {ratio:.1f}x")
    # Peak resident memory of this process: with --reuse, the report builds' (and the peer's).
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["peak RSS (MB)"] = peak_mb
    print(f"peak RSS of this process: {peak_mb:.0f} MB")
    return results


if __name__ == "__main__":
    main()
