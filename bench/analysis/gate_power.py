"""The gate's false regressions on an unchanged candidate when whole runs differ, and its power.

    .venv/bin/python bench/analysis/gate_power.py [--sets 400] [--power-sets 200] [--only aa_h25,...] \\
        [--out table.md]

Every set is a seeded synthetic gate experiment (tests/analysis/synthetic.py: B0 and one
candidate, 2 repeats x 240 requests per run unless a scenario says otherwise, 80% short / 20%
long, the cells paired on the same requests) sent through the real build_report and the real
gate verdict (apps/gate/verdict.gate_verdict); a false regression is exit 1 on an unchanged
candidate, power is exit 1 on a slower one. Whole runs differ as on real hardware (issue #32):

- ``host_sigma``: each run's latencies scaled by its own log-normal factor (sigma 0, 0.1, 0.25,
  0.4), independent across cells and rounds;
- ``round_sigma``: a factor per repeat round shared by both cells of the round (the round's
  trace, the host's state that hour), alone and with a per-run factor on top.

Two rules side by side on the same sets: "bootstrap only" (requests drawn within runs; the
report's ``p_worse_repeats`` removed, which the verdict reads as a report from before that
test) and the gate's rule (the larger of the bootstrap's and the repeats' p-value, Holm over
every judged case). The drift each verdict showed (apps/gate/verdict._drift) is summarised for
the long class's judged end-to-end tail: the repeats' spread and the smallest worsening the
repeats' test alone could call significant. Each rate comes with its exact 95% Clopper-Pearson
interval. Two processes (the 2-core VM's rule). It prints the table (and writes it to ``--out``);
bench/results/gate_power.md holds a recorded run with what it means.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scipy.stats import beta  # noqa: E402

from apps.analysis.report import build_report  # noqa: E402
from apps.gate.verdict import gate_verdict  # noqa: E402
from tests.analysis.synthetic import Design, result_set  # noqa: E402

GATE = {"cells": 2, "repeats": 2, "requests": 240}
SLOWER = {"C1": 1.4}  # the candidate's long class 40% slower

# key -> (label, design); keys starting with "aa" are unchanged candidates.
SCENARIOS: dict[str, tuple[str, Design]] = {
    "aa_h0": ("unchanged, run sigma 0", Design(**GATE)),
    "aa_h10": ("unchanged, run sigma 0.1", Design(**GATE, host_sigma=0.1)),
    "aa_h25": ("unchanged, run sigma 0.25", Design(**GATE, host_sigma=0.25)),
    "aa_h40": ("unchanged, run sigma 0.4", Design(**GATE, host_sigma=0.4)),
    "aa_r25": ("unchanged, round sigma 0.25 (shared by both cells)", Design(**GATE, round_sigma=0.25)),
    "aa_r25_h25": (
        "unchanged, round sigma 0.25 and run sigma 0.25",
        Design(**GATE, round_sigma=0.25, host_sigma=0.25),
    ),
    "ab_h0": ("long 40% slower, run sigma 0, 2 repeats", Design(**GATE, long_factor=SLOWER)),
    "ab_h25": (
        "long 40% slower, run sigma 0.25, 2 repeats",
        Design(**GATE, host_sigma=0.25, long_factor=SLOWER),
    ),
    "ab_h25_r5": (
        "long 40% slower, run sigma 0.25, 5 repeats",
        Design(**{**GATE, "repeats": 5}, host_sigma=0.25, long_factor=SLOWER),
    ),
    "ab_h25_r10": (
        "long 40% slower, run sigma 0.25, 10 repeats",
        Design(**{**GATE, "repeats": 10}, host_sigma=0.25, long_factor=SLOWER),
    ),
    "ab_h25_r20": (
        "long 40% slower, run sigma 0.25, 20 repeats",
        Design(**{**GATE, "repeats": 20}, host_sigma=0.25, long_factor=SLOWER),
    ),
    "ab2_h25": (
        "long 2x slower, run sigma 0.25, 2 repeats",
        Design(**GATE, host_sigma=0.25, long_factor={"C1": 2.0}),
    ),
}
# The drift shown is summarised for the long class's judged end-to-end tail: p95 below 299
# pooled long requests (2 to 6 repeats of 48), p99 from there.
DRIFT_CASES = (("long", "e2e_p99_ms"), ("long", "e2e_p95_ms"))


def _without_repeats_test(report: dict[str, Any]) -> dict[str, Any]:
    comps = []
    for c in report.get("comparisons") or []:
        metrics = {m: {k: x for k, x in v.items() if k != "p_worse_repeats"} for m, v in c["metrics"].items()}
        comps.append({**c, "metrics": metrics})
    return {**report, "comparisons": comps}


def one(job: tuple[str, int]) -> dict[str, Any]:
    key, seed = job
    report = build_report(**result_set(SCENARIOS[key][1], seed), token_hists={}, chunk_hists={}, options=None)
    gate = gate_verdict(report, candidate="C1")
    boot = gate_verdict(_without_repeats_test(report), candidate="C1")
    case = next(
        (c for c in gate["cases"] if (c["class"], c["metric"]) in DRIFT_CASES and c["outcome"] != "skipped"),
        {},
    )
    return {
        "key": key,
        "exit": gate["exit_code"],
        "boot_exit": boot["exit_code"],
        "failed": [f"{c['class']} {c['metric']}" for c in gate["cases"] if c["outcome"] == "fail"],
        "spread": case.get("repeats_sd_rel"),
        "stand_out": case.get("stand_out_rel"),
    }


def interval(k: int, n: int) -> str:
    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return f"{k}/{n} = {100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.0%}" if known else "—"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", type=int, default=400, help="unchanged-candidate sets per scenario")
    parser.add_argument("--power-sets", type=int, default=200, help="sets per slower-candidate scenario")
    parser.add_argument("--only", default="", help="comma list of scenario keys")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    opts = parser.parse_args(argv)
    keys = [k for k in SCENARIOS if not opts.only or k in opts.only.split(",")]
    jobs = [
        (k, 10_000 + s) for k in keys for s in range(opts.sets if k.startswith("aa") else opts.power_sets)
    ]
    started = time.perf_counter()
    if opts.processes > 1:
        with Pool(opts.processes) as pool:
            results = pool.map(one, jobs, chunksize=4)
    else:
        results = [one(job) for job in jobs]
    took = time.perf_counter() - started
    lines = [
        "| scenario | exit 1, bootstrap only | exit 1, the gate (bootstrap + repeats) | exit 2 "
        "| long e2e tail: runs spread, median | stands out above, median |",
        "|---|---|---|---|---|---|",
    ]
    failing: dict[str, dict[str, int]] = {}
    for key in keys:
        rows = [r for r in results if r["key"] == key]
        n = len(rows)
        inconclusive = sum(r["exit"] == 2 for r in rows)
        lines.append(
            f"| {SCENARIOS[key][0]} | {interval(sum(r['boot_exit'] == 1 for r in rows), n)} "
            f"| {interval(sum(r['exit'] == 1 for r in rows), n)} | {inconclusive} "
            f"| {_median([r['spread'] for r in rows])} | +{_median([r['stand_out'] for r in rows])} |"
        )
        for r in rows:
            for case in r["failed"]:
                failing.setdefault(key, {}).setdefault(case, 0)
                failing[key][case] += 1
    lines += ["", "Cases that failed (sets):", ""]
    for key, cases in failing.items():
        lines.append(f"- {SCENARIOS[key][0]}: " + ", ".join(f"{c} {k}" for c, k in sorted(cases.items())))
    lines += ["", f"{len(jobs)} sets in {took:.0f} s on {opts.processes} processes."]
    text = "\n".join(lines) + "\n"
    print(text)
    if opts.out:
        opts.out.write_text(text)


if __name__ == "__main__":
    main()
