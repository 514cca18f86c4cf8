"""The gate's false failures between identical configs and its power, with and without the repeats' test.

    .venv/bin/python bench/analysis/gate_power.py [--sets 300] [--out bench/results/gate_power.md]

Every set is a seeded synthetic gate experiment (tests/analysis/synthetic.py:
B0 and one candidate, 80% short / 20% long, the cells paired on the same
requests) sent through the real build_report and the real gate verdict
(apps/gate/verdict.py). Two rules side by side on the same sets:

- "bootstrap only": the rule before the repeats' test (requests drawn within
  runs; the report's ``p_worse_repeats`` removed, which the verdict reads as a
  report from before that test);
- "bootstrap + repeats": today's rule, the larger of the two p-values.

Scenarios: hosts whose whole runs are slower or faster by chance
(``host_sigma``: 0, 0.1, 0.2 log-sigma; measured on this CPU host, an unchanged
candidate's p99 differed from B0's by up to 0.7 s on 1-2.5 s between runs),
and a candidate whose long class is 1.5x, 2x and 3x slower. False failure =
exit 1 on an unchanged candidate; power = exit 1 on a slower one. Each rate
comes with its exact 95% Clopper-Pearson interval.
"""

from __future__ import annotations

import argparse
import os
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

SCENARIOS: dict[str, tuple[str, Design]] = {
    "aa": ("A/A, idle hosts", Design(cells=2, repeats=2, requests=240)),
    "aa_h10": (
        "A/A, whole runs noisy (host sigma 0.1)",
        Design(cells=2, repeats=2, requests=240, host_sigma=0.1),
    ),
    "aa_h20": (
        "A/A, whole runs noisy (host sigma 0.2)",
        Design(cells=2, repeats=2, requests=240, host_sigma=0.2),
    ),
    "ab15": (
        "long class 1.5x slower, host sigma 0.1",
        Design(cells=2, repeats=2, requests=240, host_sigma=0.1, long_factor={"C1": 1.5}),
    ),
    "ab2": (
        "long class 2x slower, host sigma 0.1",
        Design(cells=2, repeats=2, requests=240, host_sigma=0.1, long_factor={"C1": 2.0}),
    ),
    "ab3": (
        "long class 3x slower, host sigma 0.1",
        Design(cells=2, repeats=2, requests=240, host_sigma=0.1, long_factor={"C1": 3.0}),
    ),
    "ab2_r3": (
        "long class 2x slower, host sigma 0.1, 3 repeats",
        Design(cells=2, repeats=3, requests=240, host_sigma=0.1, long_factor={"C1": 2.0}),
    ),
}


def _without_repeats_test(report: dict[str, Any]) -> dict[str, Any]:
    comps = []
    for c in report.get("comparisons") or []:
        metrics = {m: {k: x for k, x in v.items() if k != "p_worse_repeats"} for m, v in c["metrics"].items()}
        comps.append({**c, "metrics": metrics})
    return {**report, "comparisons": comps}


def one(args: tuple[str, int]) -> tuple[str, int, int]:
    key, seed = args
    design = SCENARIOS[key][1]
    report = build_report(**result_set(design, seed), token_hists={}, chunk_hists={}, options=None)
    both = gate_verdict(report, candidate="C1")["exit_code"]
    boot = gate_verdict(_without_repeats_test(report), candidate="C1")["exit_code"]
    return key, int(boot == 1), int(both == 1)


def interval(k: int, n: int) -> str:
    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sets", type=int, default=300)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gate_power.md"))
    opts = parser.parse_args()
    jobs = [(key, 10_000 + s) for key in SCENARIOS for s in range(opts.sets)]
    started = time.perf_counter()
    with Pool(os.cpu_count() or 1) as pool:
        results = pool.map(one, jobs, chunksize=4)
    took = time.perf_counter() - started
    lines = [
        "# The gate: false failures and power, bootstrap only vs bootstrap + repeats",
        "",
        f"`.venv/bin/python bench/analysis/gate_power.py --sets {opts.sets}` "
        f"({opts.sets} seeded sets per scenario, both rules on the same sets, {took:.0f} s).",
        "",
        "| scenario | exit 1, bootstrap only | exit 1, bootstrap + repeats |",
        "|---|---|---|",
    ]
    for key, (label, _) in SCENARIOS.items():
        rows = [r for r in results if r[0] == key]
        n = len(rows)
        lines.append(
            f"| {label} | {interval(sum(r[1] for r in rows), n)} | {interval(sum(r[2] for r in rows), n)} |"
        )
    text = "\n".join(lines) + "\n"
    Path(opts.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
