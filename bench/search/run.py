"""Search against the full grid on a synthetic response surface (issue #36's acceptance). No GPU.

    PYTHONPATH=. .venv/bin/python bench/search/run.py [--seeds 20] [--out bench/results/search.md]

A fake executor stands in for vLLM: per class, the p99 of its primary metric is a function of the
knobs with a real optimum (drawn per seed), times a load factor per (mixture, rate), times
log-normal noise per run and a factor shared by every cell of a round (what the paired design
removes). Two surfaces:

- sloped: the short class's TTFT p99 grows with the squared log-distance of the token budget and
  the sequence limit from its optimum, and with chunked prefill off; the long class's end-to-end
  p99 likewise around its own (larger) budget optimum; the priority policy helps the short class
  and costs the long one. A config with 128 sequences and a budget of 8192 or more does not start
  (the fake KV cache is too small): the search records it as failed with the reason and goes on.
- flat: every config is B0 (the A/A case): the search must end in retain.

Each seed runs, on the same surface and noise model:

- the search: apps/search/study.propose (Optuna TPE, the study rebuilt from the recorded trials
  each time) for at most ``max_trials`` trials, one run each at the screening point (the heaviest
  mixture at the highest rate), stopping by apps/search/objective.stop_reason; then the best k
  (objective.best_k) confirmed against B0 with the full paired design in fresh rounds, judged by
  a compact stand-in for the verdict (acceptance at every point; no class's primary metric shown
  worse than the 25% non-inferiority margin; a material gain Holm-significant over the family of
  confirmed cells x points x classes), and among the cells it allows, the one with the largest
  confirmed margin (objective.pick_confirmed, the rule apps/analysis/decide.py applies to a
  search experiment);
- the grid: every valid config of the same space (the log range at powers of two) through the
  full design, judged by the same stand-in with the family over all its cells.

A run costs its windows plus the server start (150 s here); a server that does not start costs the
start alone. "Within 5%": the proposed config's true margin (noise-free, worst class over every
point) is at least the space's best minus 5% of it; retain counts as proposing B0.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from apps.experiments.spec_search import DEFAULT_CONFIRM, DEFAULT_MAX_TRIALS, range_values
from apps.search.objective import FAILED, Trial, best_k, outcome_of, pick_confirmed, stop_reason
from apps.search.study import propose, server_args

SPACE: dict[str, dict[str, Any]] = {
    "max_num_batched_tokens": {"min": 256, "max": 8192, "log": True},
    "max_num_seqs": {"values": [8, 16, 32, 64, 128]},
    "enable_chunked_prefill": {"values": [True, False]},
    "scheduling_policy": {"values": ["fcfs", "priority"]},
}
B0 = {
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 16,
    "enable_chunked_prefill": True,
    "scheduling_policy": "fcfs",
}
MAX_MODEL_LEN = 2048
LIMITS = {"short": 500.0, "long": 20_000.0}  # ttft_p99_ms, e2e_p99_ms
POINTS = {("50-50", "high"): 1.0, ("50-50", "low"): 0.7, ("80-20", "high"): 0.85, ("80-20", "low"): 0.6}
SCREEN = ("50-50", "high")
REPEATS = 5
RUN_S = 90.0  # warm-up + observation + drain
START_S = 60.0  # a server start (and stop)
RUN_SIGMA = 0.03  # a run's p99 against the cell's true p99 (log scale)
ROUND_SIGMA = 0.04  # a round's factor, shared by its cells
MATERIAL = math.log(0.95)  # a gain must be at least 5%
NONINFERIOR = math.log(1.25)  # the non-inferiority margin
ALPHA = 0.05
BUDGET: dict[str, Any] = {"max_trials": DEFAULT_MAX_TRIALS, "max_engine_hours": None, "patience": None}
CONFIRM = DEFAULT_CONFIRM


@dataclass(frozen=True)
class Surface:
    flat: bool
    b_short: float
    b_long: float
    seqs: float

    def p99(self, config: dict[str, Any], point: tuple[str, str]) -> dict[str, float]:
        load = POINTS[point]
        if self.flat:
            config = B0
        b = math.log2(config["max_num_batched_tokens"])
        s = math.log2(config["max_num_seqs"])
        chunked = config["enable_chunked_prefill"]
        priority = config["scheduling_policy"] == "priority"
        short = 320.0 * load * (1 + 0.08 * (b - self.b_short) ** 2) * (1 + 0.05 * (s - self.seqs) ** 2)
        short *= (1.0 if chunked else 1.25) * (0.88 if priority else 1.0)
        long = 13_000.0 * load * (1 + 0.06 * (b - self.b_long) ** 2) * (1 + 0.04 * (s - self.seqs) ** 2)
        long *= (1.0 if chunked else 0.95) * (1.06 if priority else 1.0)
        return {"short": short, "long": long}

    def starts(self, config: dict[str, Any]) -> str | None:
        if not self.flat and config["max_num_seqs"] >= 128 and config["max_num_batched_tokens"] >= 8192:
            return "server did not start: KV cache too small for 128 sequences at a budget of 8192 (fake)"
        return None

    def throughput(self, config: dict[str, Any]) -> float:
        return 10.0 * (1 + 0.02 * math.log2(config["max_num_seqs"]))

    def true_margin(self, config: dict[str, Any]) -> float:
        if self.starts(config) is not None:
            return -math.inf
        return min(margin(self.p99(config, p)) for p in POINTS)


def margin(p99: dict[str, float]) -> float:
    return min((LIMITS[c] - v) / LIMITS[c] for c, v in p99.items())


def surface(seed: int, *, flat: bool) -> Surface:
    rng = np.random.default_rng(seed)
    b_short = rng.uniform(8.5, 11.5)
    return Surface(flat, b_short, b_short + rng.uniform(1.0, 2.5), rng.uniform(3.5, 6.5))


def grid_configs() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{}]
    for knob, entry in SPACE.items():
        values = entry["values"] if "values" in entry else range_values(entry)
        out = [{**c, knob: v} for c in out for v in values]
    # vLLM's rule: with chunked prefill off, the budget holds a whole prompt.
    return [c for c in out if c["enable_chunked_prefill"] or c["max_num_batched_tokens"] >= MAX_MODEL_LEN]


def measure(
    sf: Surface, config: dict[str, Any], point: tuple[str, str], rng: np.random.Generator, round_f: float
) -> dict[str, float]:
    return {c: v * round_f * math.exp(rng.normal(0, RUN_SIGMA)) for c, v in sf.p99(config, point).items()}


def screen(sf: Surface, seed: int, rng: np.random.Generator) -> tuple[list[Trial], str]:
    trials: list[Trial] = []
    while (why := stop_reason(trials, **BUDGET)) is None:
        params = propose(SPACE, trials, baseline_args=B0, max_model_len=MAX_MODEL_LEN, seed=seed)
        if params is None:
            why = "space used up"
            break
        config = server_args(params, baseline_args=B0, max_model_len=MAX_MODEL_LEN)
        failure = sf.starts(config)
        if failure is not None:
            trials.append(Trial(len(trials), params, FAILED, engine_s=START_S, reason=failure))
            continue
        m = margin(measure(sf, config, SCREEN, rng, math.exp(rng.normal(0, ROUND_SIGMA))))
        trials.append(
            Trial(len(trials), params, outcome_of(m), m, sf.throughput(config), engine_s=RUN_S + START_S)
        )
    return trials, why


def design(sf: Surface, cells: dict[str, dict[str, Any]], rng: np.random.Generator) -> tuple[dict, float]:
    """Every cell at every point for REPEATS rounds: cell -> point -> class -> [p99 per round]."""
    data: dict[str, dict] = {cell: {p: {"short": [], "long": []} for p in POINTS} for cell in cells}
    cost = 0.0
    for _ in range(REPEATS):
        for p in POINTS:
            round_f = math.exp(rng.normal(0, ROUND_SIGMA))
            for cell, config in cells.items():
                if sf.starts(config) is not None:
                    cost += START_S
                    data[cell] = None
                    continue
                cost += RUN_S + START_S
                if data[cell] is None:
                    continue
                for c, v in measure(sf, config, p, rng, round_f).items():
                    data[cell][p][c].append(v)
    return data, cost


def verdict(data: dict, cells: list[str]) -> tuple[str, dict[str, float]]:
    """The stand-in verdict: the proposed cell ("B0": retain) and each cell's confirmed margin."""
    b0 = data["B0"]
    tests = []  # (p-value, cell, material)
    allowed = set()
    margins: dict[str, float] = {}
    margins["B0"] = min(margin({c: statistics.fmean(b0[p][c]) for c in LIMITS}) for p in POINTS)
    for cell in cells:
        d = data[cell]
        if d is None:
            continue
        keeps = True
        noninferior = True
        margins[cell] = min(margin({c: statistics.fmean(d[p][c]) for c in LIMITS}) for p in POINTS)
        for p in POINTS:
            for c in LIMITS:
                if statistics.fmean(d[p][c]) > LIMITS[c]:
                    keeps = False
                r = np.log(np.array(d[p][c])) - np.log(np.array(b0[p][c]))
                mean, se = float(r.mean()), float(r.std(ddof=1) / math.sqrt(len(r))) or 1e-12
                upper = mean + stats.t.ppf(0.95, len(r) - 1) * se
                if upper > NONINFERIOR:
                    noninferior = False
                pval = float(stats.t.cdf(mean / se, len(r) - 1))  # one-sided: candidate lower
                tests.append((pval, cell, mean <= MATERIAL, keeps))
        if keeps and noninferior:
            allowed.add(cell)
    # Holm over the family of allowed cells' (point, class) gains.
    family = sorted((t for t in tests if t[1] in allowed), key=lambda t: t[0])
    better = set()
    for i, (pval, cell, material, _) in enumerate(family):
        if pval > ALPHA / (len(family) - i):
            break
        if material:
            better.add(cell)
    eligible = [c for c in cells if c in allowed and c in better]
    return pick_confirmed(eligible, margins, baseline=margins["B0"]) or "B0", margins


def one_seed(seed: int, *, flat: bool, with_grid: bool) -> dict[str, Any]:
    sf = surface(seed, flat=flat)
    rng = np.random.default_rng(10_000 + seed)
    trials, why = screen(sf, seed, rng)
    chosen = best_k(trials, CONFIRM)
    cells = {
        "B0": B0,
        **{
            f"T{t.number}": server_args(t.params, baseline_args=B0, max_model_len=MAX_MODEL_LEN)
            for t in chosen
        },
    }
    data, confirm_cost = design(sf, cells, rng)
    proposed, _ = verdict(data, [c for c in cells if c != "B0"])
    search_cost = sum(t.engine_s for t in trials) + confirm_cost
    grid = grid_configs()
    best = max(sf.true_margin(c) for c in grid + [B0])
    out = {
        "seed": seed,
        "trials": len(trials),
        "failed": sum(t.outcome == FAILED for t in trials),
        "stop": why,
        "proposed": proposed,
        "true": sf.true_margin(cells[proposed]),
        "best": best,
        "b0": sf.true_margin(B0),
        "search_s": search_cost,
        "grid_cells": len(grid),
    }
    grid_cost = 0.0
    if with_grid:
        gcells = {"B0": B0, **{f"G{i}": c for i, c in enumerate(grid)}}
        gdata, grid_cost = design(sf, gcells, np.random.default_rng(20_000 + seed))
        gproposed, _ = verdict(gdata, [c for c in gcells if c != "B0"])
        out["grid_proposed"] = gproposed
        out["grid_true"] = sf.true_margin(gcells[gproposed])
    else:
        grid_cost = len(grid) * 0.0 + (len(grid) + 1) * len(POINTS) * REPEATS * (RUN_S + START_S)
    out["grid_s"] = grid_cost
    return out


def within(true: float, best: float) -> bool:
    return true >= best - 0.05 * abs(best)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--out", default="")
    ap.add_argument("--max-trials", type=int, default=BUDGET["max_trials"])
    ap.add_argument("--patience", type=int, default=None)
    ap.add_argument("--only", default="", help="sloped or flat")
    ap.add_argument("--confirm", type=int, default=CONFIRM)
    ap.add_argument("--run-sigma", type=float, default=RUN_SIGMA)
    args = ap.parse_args(argv)
    globals().update(CONFIRM=args.confirm, RUN_SIGMA=args.run_sigma)
    BUDGET.update(max_trials=args.max_trials, patience=args.patience)
    started = time.time()
    rows = {
        name: [one_seed(s, flat=name == "flat", with_grid=True) for s in range(args.seeds)]
        for name in ("sloped", "flat")
        if args.only in ("", name)
    }
    lines = [
        "# Search against the grid (bench/search/run.py)",
        "",
        f"`PYTHONPATH=. .venv/bin/python bench/search/run.py --seeds {args.seeds}`: {time.time() - started:.0f} s "
        "on the 2-core VM. Space: token budget 256..8192 (log; the grid at powers of two), max_num_seqs "
        "8..128 (5), chunked prefill on/off, fcfs/priority; B0 = 2048, 32, on, fcfs; max_model_len 2048. "
        f"Design: 2 mixtures x 2 rates x {REPEATS} repeats; budget max_trials {BUDGET['max_trials']}, "
        f"patience {BUDGET['patience']}, confirm {CONFIRM}; a run's p99 noise sigma {RUN_SIGMA} (log), "
        f"a round's shared factor sigma {ROUND_SIGMA}.",
        "",
    ]
    for name, rs in rows.items():
        ratios = [r["search_s"] / r["grid_s"] for r in rs]
        ok = [within(r["true"], r["best"]) for r in rs]
        gok = [within(r["grid_true"], r["best"]) for r in rs]
        retain = [r["proposed"] == "B0" for r in rs]
        gretain = [r["grid_proposed"] == "B0" for r in rs]
        lines += [
            f"## {name} surface ({len(rs)} seeds)",
            "",
            "| | search | grid |",
            "|---|---|---|",
            f"| configs run | median {statistics.median(r['trials'] for r in rs):g} trials + {CONFIRM} confirmed "
            f"| {rs[0]['grid_cells']} cells |",
            f"| engine-seconds, median | {statistics.median(r['search_s'] for r in rs):,.0f} "
            f"| {statistics.median(r['grid_s'] for r in rs):,.0f} |",
            f"| cost / grid's: median, max | {statistics.median(ratios):.1%}, {max(ratios):.1%} | 100% |",
            f"| proposed within 5% of the best true margin | {sum(ok)}/{len(rs)} | {sum(gok)}/{len(rs)} |",
            f"| retain | {sum(retain)}/{len(rs)} | {sum(gretain)}/{len(rs)} |",
            f"| failed trials (server did not start), total | {sum(r['failed'] for r in rs)} | |",
            "",
            "| seed | trials | stop | proposed | its true margin | best | B0 | cost/grid | grid proposed | its true |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rs:
            lines.append(
                f"| {r['seed']} | {r['trials']} | {r['stop']} | {r['proposed']} | {r['true']:.3f} | {r['best']:.3f} "
                f"| {r['b0']:.3f} | {r['search_s'] / r['grid_s']:.1%} | {r['grid_proposed']} | {r['grid_true']:.3f} |"
            )
        lines.append("")
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
