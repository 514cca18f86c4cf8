"""False retunes between identical configs (A/A) and the power to find a real gain (A/B).

    .venv/bin/python bench/analysis/aa_power.py [--sets 400] [--ab-sets 400] [--ab10-sets 200] \
        [--out bench/results/aa_power.md]

Every set is a seeded synthetic experiment (tests/analysis/synthetic.py: four
cells, 3 repeats x 480 requests per run, 80% short / 20% long, the cells paired
on the same requests) sent through the real build_report with its default
options. Scenarios:

- A/A, independent requests; A/A with AR(1) queueing correlation (phi 0.9);
  both again with contracts at B0's true p99 (B0 breaks them by chance);
  A/A at four (mixture, rate) points. False retune = any retune.
- A/B: C1's long class 40% faster at today's sizes; 20% faster at 10x the
  requests. Power = the share of sets that retune to C1 (a retune to another
  cell counts as a false retune).

Each rate comes with its exact 95% Clopper-Pearson interval. The run uses both
cores (one process each); it takes about 15 minutes on the 2-core VM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scipy.stats import beta  # noqa: E402

from tests.analysis.synthetic import Design, verdict  # noqa: E402

SCENARIOS: dict[str, tuple[str, Design]] = {
    "aa": ("A/A, independent requests", Design()),
    "aa_ar": ("A/A, AR(1) queueing correlation, phi 0.9", Design(phi=0.9)),
    "aa_near": ("A/A, contracts at B0's true p99", Design(near_limit=True)),
    "aa_near_ar": ("A/A, contracts at B0's true p99, AR(1) 0.9", Design(near_limit=True, phi=0.9)),
    "aa_4pt": ("A/A, four (mixture, rate) points", Design(points=4)),
    "ab40": ("A/B, C1 long class 40% faster, 3 x 480 requests", Design(long_factor={"C1": 0.6})),
    "ab20_x10": (
        "A/B, C1 long class 20% faster, 3 x 4,800 requests",
        Design(requests=4800, long_factor={"C1": 0.8}),
    ),
}


def _one(job: tuple[str, int]) -> tuple[str, dict]:
    name, seed = job
    return name, verdict(SCENARIOS[name][1], seed)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", type=int, default=400, help="A/A sets per scenario")
    ap.add_argument("--ab-sets", type=int, default=400)
    ap.add_argument("--ab10-sets", type=int, default=200)
    ap.add_argument("--only", default="", help="comma list of scenario names")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    counts = {name: args.sets for name in SCENARIOS if name.startswith("aa")}
    counts.update(ab40=args.ab_sets, ab20_x10=args.ab10_sets)
    if args.only:
        counts = {k: v for k, v in counts.items() if k in args.only.split(",")}
    jobs = [(name, seed) for name, n in counts.items() for seed in range(n)]
    started = time.perf_counter()
    with Pool(min(2, os.cpu_count() or 1)) as pool:
        results = pool.map(_one, jobs, chunksize=4)
    wall = time.perf_counter() - started
    lines = [
        "| scenario | sets | retune to C1 | false retune | rate [95% CI] | borderline decisions | outcomes |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in counts:
        rs = [r for k, r in results if k == name]
        n = len(rs)
        to_c1 = sum(1 for r in rs if r["outcome"] == "retune" and r["chosen_cell"] == "C1")
        is_ab = name.startswith("ab")
        false = sum(1 for r in rs if r["outcome"] == "retune" and (not is_ab or r["chosen_cell"] != "C1"))
        k = to_c1 if is_ab else false
        lo, hi = clopper_pearson(k, n)
        label = "power" if is_ab else "false retune"
        outcomes = ", ".join(
            f"{o} {c}" for (o, _), c in sorted(Counter((r["outcome"], 0) for r in rs).items())
        )
        lines.append(
            f"| {SCENARIOS[name][0]} | {n} | {to_c1 if is_ab else '—'} | {false} | "
            f"{label} {k / n:.1%} [{lo:.1%}, {hi:.1%}] | {sum(r['borderline'] for r in rs)} | {outcomes} |"
        )
    power_rows = [
        "",
        "Smallest change of the primary metric found with 80% power (set 0 of each scenario):",
        "",
    ]
    for name in counts:
        first = next(r for k, r in results if k == name and r["seed"] == 0)
        figures = "; ".join(
            f"{p['class']} {p['metric']} {p['detectable_rel']:.0%}"
            if p.get("detectable_rel")
            else f"{p['class']} —"
            for p in first["power"]
        )
        power_rows.append(f"- {SCENARIOS[name][0]}: {figures}")
    text = (
        "\n".join(lines + power_rows) + f"\n\n{len(jobs)} sets in {wall:.0f} s on {os.cpu_count()} cores.\n"
    )
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
