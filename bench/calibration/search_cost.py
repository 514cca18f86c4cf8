"""What the capacity probe costs in engine runs, beside a plain rate ladder.

Every probe step is one engine run (a server start, warm-up, the probe's
observation window and drain), so on a GPU host the number of steps is the
cost. This script counts steps, it does not time anything: for true
capacities spread log-uniformly over 0.5-200 req/s, it runs

- the probe's search (apps/runs/capacity.py ``next_rate``: doubling from
  ``start_rps``, then bisecting to ``tolerance``, at most ``max_steps``), and
- the peer: a geometric ladder start x 1.1^k, stepped up until a step fails
  (the same 10 % resolution the search's default tolerance asks for),

against a step outcome "passes iff rate <= capacity", and again with a noisy
edge (within +-5 % of the capacity a step passes or fails at random). It
reports steps per search, the found capacity relative to the true one, and
how often the found capacity exceeds the true one (it must never exceed a
failure it saw; noise can still make it exceed the true value).

Run: .venv/bin/python bench/calibration/search_cost.py  (no engine; the database is not touched)
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django

django.setup()  # the search is pure, but its module imports models

from apps.runs.capacity import capacity_of, next_rate  # noqa: E402

START, TOLERANCE, MAX_STEPS = 1.0, 0.1, 8
LADDER_FACTOR, LADDER_MAX = 1.1, 200


def outcome(rate: float, capacity: float, rng: random.Random | None) -> bool:
    if rng is not None and abs(rate - capacity) <= 0.05 * capacity:
        return rng.random() < 0.5
    return rate <= capacity


def search(capacity: float, rng: random.Random | None, max_steps: int) -> tuple[int, float | None]:
    history: list[tuple[float, bool]] = []
    while (
        rate := next_rate(history=history, start_rps=START, tolerance=TOLERANCE, max_steps=max_steps)
    ) is not None:
        history.append((rate, outcome(rate, capacity, rng)))
    return len(history), capacity_of(history)[0]


def ladder(capacity: float, rng: random.Random | None) -> tuple[int, float | None]:
    history: list[tuple[float, bool]] = []
    for k in range(LADDER_MAX):
        rate = START * LADDER_FACTOR**k
        ok = outcome(rate, capacity, rng)
        history.append((rate, ok))
        if not ok:
            break
    return len(history), capacity_of(history)[0]


def summarise(name: str, results: list[tuple[float, int, float | None]]) -> dict[str, float]:
    steps = [s for _, s, _ in results]
    found = [(c, f) for c, _, f in results if f is not None]
    ratio = [f / c for c, f in found]
    return {
        "name": name,
        "mean_steps": statistics.fmean(steps),
        "max_steps": max(steps),
        "found": len(found) / len(results),
        "ratio_p05": sorted(ratio)[int(0.05 * len(ratio))] if ratio else math.nan,
        "ratio_median": statistics.median(ratio) if ratio else math.nan,
        "above_true": sum(1 for r in ratio if r > 1.0) / len(results),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--capacities", type=int, default=2000, help="true capacities drawn (the smoke test: 20)"
    )
    args = parser.parse_args(argv)
    rng_caps = random.Random(7)
    capacities = [math.exp(rng_caps.uniform(math.log(0.5), math.log(200))) for _ in range(args.capacities)]
    rows = []
    for noisy in (False, True):
        rng = random.Random(11) if noisy else None
        edge = "noisy edge" if noisy else "sharp edge"
        methods = (
            (f"search, max_steps {MAX_STEPS}", lambda c, r: search(c, r, MAX_STEPS)),
            ("search, max_steps 12", lambda c, r: search(c, r, 12)),
            ("ladder x1.1", lambda c, r: ladder(c, r)),
        )
        for label, fn in methods:
            rows.append((edge, summarise(label, [(c, *fn(c, rng)) for c in capacities])))
    print(
        f"{len(capacities)} capacities, log-uniform 0.5-200 req/s; start {START} req/s, tolerance {TOLERANCE}"
    )
    print(f"{'edge':<11} {'method':<22} {'steps mean':>10} {'max':>4} {'found':>6} {'p05 found/true':>15} "
          f"{'median':>7} {'> true':>7}")  # fmt: skip
    for edge, r in rows:
        print(f"{edge:<11} {r['name']:<22} {r['mean_steps']:>10.2f} {r['max_steps']:>4} {r['found']:>6.1%} "
              f"{r['ratio_p05']:>15.3f} {r['ratio_median']:>7.3f} {r['above_true']:>7.1%}")  # fmt: skip
    by = {(e, r["name"]): r for e, r in rows}
    for edge in ("sharp edge", "noisy edge"):
        peer = by[(edge, "ladder x1.1")]["mean_steps"]
        for name in (f"search, max_steps {MAX_STEPS}", "search, max_steps 12"):
            print(f"{edge}: ladder / {name}: {peer / by[(edge, name)]['mean_steps']:.1f}x the engine runs")


if __name__ == "__main__":
    main()
