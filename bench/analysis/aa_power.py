"""False retunes and false harms between identical configs (A/A), and the power to find a real gain (A/B).

    .venv/bin/python bench/analysis/aa_power.py [--sets 400] [--extra-sets 400] [--ab-sets 400] \
        [--verify-sets 200] [--pilot-sets 30] \
        [--ab10-sets 200] [--more-repeats 12,18 --more-sets 100] [--only NAMES] \
        [--raw FILE] [--progress FILE] [--from-raw FILE] [--out FILE]

Every set is a seeded synthetic experiment (tests/analysis/synthetic.py: four
cells, 3 repeats x 480 requests per run, 80% short / 20% long, the cells paired
on the same requests) sent through the real build_report with its default
options. Scenarios:

- A/A with whole runs faster or slower (``host_sigma``: a log-normal factor per
  run, independent across cells and rounds) at sigma 0, 0.1, 0.25 and 0.4, and
  with a round-level factor shared by every cell of a round (``round_sigma``
  0.25): ``--sets`` each.
- A/A, the request-level cases: AR(1) queueing correlation (phi 0.9); contracts
  at B0's true p99 (B0 breaks them by chance), with and without AR(1); four
  (mixture, rate) points: ``--extra-sets`` each.
- False retune = any retune. False harm = a set where any candidate has a metric
  called materially worse than B0 (decision evidence ``material_worse``).
- A/B: C1's long class 40% faster at sigma 0 and 0.25 (``--ab-sets`` each).
  Then the repeats the run-level test needs for 80% power at sigma 0.25:
  inference.repeats_needed at the long class's run spread the sigma-0.25 A/B
  sets measured, and ``--verify-sets`` sets at that many repeats to check it.
  From four repeats on the long class has requests enough to be judged on its
  p99 rather than its p95, whose runs spread more, so the figure is then
  recomputed from a pilot (``--pilot-sets``) at that many repeats until it
  settles, and ``--verify-sets`` more sets check the settled figure. Optionally
  (``--ab10-sets``) C1 20% faster at 10x the requests, and (``--more-repeats``)
  the sigma-0.25 A/B at other numbers of repeats, to find where the verdict
  itself reaches 80%. Power = the share of sets that retune to C1 (a retune to
  another cell counts as a false retune); "C1 long better" = the share where
  C1's long class is called materially better at every point (the test alone,
  before the verdict's other gates); "not shown non-inferior" = sets where C1
  was refused because a class's primary metric was not shown non-inferior.

Each rate comes with its exact 95% Clopper-Pearson interval. The run uses both
cores (one process each); the defaults take 30-55 minutes on the 2-core VM
(``--ab10-sets 0`` saves about a third).
``--raw`` keeps one JSON line per set, so ``--from-raw`` can redraw the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scipy.stats import beta  # noqa: E402

from apps.analysis import inference  # noqa: E402
from apps.analysis.compare_options import CompareOptions  # noqa: E402
from apps.analysis.report import build_report  # noqa: E402
from tests.analysis.synthetic import Design, result_set  # noqa: E402

FASTER_40 = {"C1": 0.6}
NOT_SHOWN = "not shown non-inferior to B0 on a class's primary metric"  # decide.py's reason


@dataclass(frozen=True)
class Scenario:
    label: str
    design: Design
    group: str  # "run" (run-level A/A), "request" (request-level A/A), "ab"


SCENARIOS: dict[str, Scenario] = {
    "aa": Scenario("A/A, run sigma 0", Design(), "run"),
    "aa_h10": Scenario("A/A, run sigma 0.1", Design(host_sigma=0.1), "run"),
    "aa_h25": Scenario("A/A, run sigma 0.25", Design(host_sigma=0.25), "run"),
    "aa_h40": Scenario("A/A, run sigma 0.4", Design(host_sigma=0.4), "run"),
    "aa_r25": Scenario(
        "A/A, round sigma 0.25 (shared by the cells of a round)", Design(round_sigma=0.25), "run"
    ),
    "aa_ar": Scenario("A/A, AR(1) queueing correlation, phi 0.9", Design(phi=0.9), "request"),
    "aa_near": Scenario("A/A, contracts at B0's true p99", Design(near_limit=True), "request"),
    "aa_near_ar": Scenario(
        "A/A, contracts at B0's true p99, AR(1) 0.9", Design(near_limit=True, phi=0.9), "request"
    ),
    "aa_4pt": Scenario("A/A, four (mixture, rate) points", Design(points=4), "request"),
    "ab40": Scenario("A/B, C1 long 40% faster, run sigma 0, 3 repeats", Design(long_factor=FASTER_40), "ab"),
    "ab40_h25": Scenario(
        "A/B, C1 long 40% faster, run sigma 0.25, 3 repeats",
        Design(long_factor=FASTER_40, host_sigma=0.25),
        "ab",
    ),
    # Their repeats are set at run time from inference.repeats_needed (main).
    "ab40_h25_needed": Scenario(
        "A/B, C1 long 40% faster, run sigma 0.25, repeats needed (from the 3-repeat spread)",
        Design(long_factor=FASTER_40, host_sigma=0.25),
        "ab",
    ),
    "ab40_h25_settled": Scenario(
        "A/B, C1 long 40% faster, run sigma 0.25, repeats needed (settled)",
        Design(long_factor=FASTER_40, host_sigma=0.25),
        "ab",
    ),
    "ab20_x10": Scenario(
        "A/B, C1 long 20% faster, run sigma 0, 3 x 4,800 requests",
        Design(requests=4800, long_factor={"C1": 0.8}),
        "ab",
    ),
}


def at_repeats(repeats: int) -> str:
    """The sigma-0.25 A/B scenario at a given number of repeats (--more-repeats), registered once."""
    name = f"ab40_h25_x{repeats}"
    if name not in SCENARIOS:
        design = replace(SCENARIOS["ab40_h25"].design, repeats=repeats)
        SCENARIOS[name] = Scenario(
            f"A/B, C1 long 40% faster, run sigma 0.25, {repeats} repeats", design, "ab"
        )
    return name


def outcome(design: Design, seed: int) -> dict[str, Any]:
    """What the counts need from build_report's report of one seeded set."""
    report = build_report(**result_set(design, seed), token_hists={}, chunk_hists={})
    d = report["decision"]
    candidates = d["evidence"].get("candidates") or []
    seed_check: Mapping[str, Any] = d.get("seed_check") or {}
    c1_long = [
        (c.get("primary"), c["metrics"])
        for c in report["comparisons"]
        if c["cell"] == "C1" and c["class"] == "long"
    ]
    return {
        "seed": seed,
        "outcome": d["outcome"],
        "chosen_cell": d["chosen_cell"],
        "borderline": bool(seed_check.get("borderline")),
        "material_worse": {c["cell"]: c["material_worse"] for c in candidates if c["material_worse"]},
        "c1_reasons": next((c["reasons"] for c in candidates if c["cell"] == "C1"), []),
        "c1_long_better": bool(c1_long)
        and all(
            primary is not None and metrics[primary]["direction"] == "better" for primary, metrics in c1_long
        ),
        "family": report["statistics"]["family"]["planned_size"],
        "power": [
            {
                k: p.get(k)
                for k in ("class", "metric", "detectable_rel", "run_sd_rel", "run_df", "repeats_needed")
            }
            for p in report["statistics"]["power"]
        ],
    }


def _one(job: tuple[str, Design, int]) -> tuple[str, dict[str, Any]]:
    name, design, seed = job
    return name, outcome(design, seed)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def rate(k: int, n: int) -> str:
    lo, hi = clopper_pearson(k, n)
    return f"{k} ({k / n:.1%} [{lo:.1%}, {hi:.1%}])"


def long_run_sd(results: Iterable[Mapping[str, Any]]) -> float | None:
    """The long class's run spread (log scale) over the sets: the root mean square of each set's fit."""
    sds = [
        math.log1p(p["run_sd_rel"])
        for r in results
        for p in r["power"]
        if p["class"] == "long" and p.get("run_sd_rel") is not None
    ]
    return math.sqrt(sum(s * s for s in sds) / len(sds)) if sds else None


def needed(results: Iterable[Mapping[str, Any]]) -> tuple[float | None, int | None]:
    """(the long class's run spread, the repeats inference.repeats_needed asks for a 40% change)."""
    rows = list(results)
    sd = long_run_sd(rows)
    if sd is None:
        return None, None
    family = rows[0]["family"]
    return sd, inference.repeats_needed(sd, 0.4, cells=4, alpha=CompareOptions().family_alpha, family=family)


# --progress: every set's line appended as it arrives, so a stopped run still leaves its sets.
PROGRESS: list[Path] = []


def run(jobs: list[tuple[str, Design, int]], processes: int) -> list[tuple[str, dict[str, Any]]]:
    out = []
    with Pool(processes) if processes > 1 else contextlib.nullcontext() as pool:
        done = pool.imap_unordered(_one, jobs, chunksize=2) if pool is not None else map(_one, jobs)
        for i, item in enumerate(done, 1):
            out.append(item)
            for path in PROGRESS:
                with path.open("a") as f:
                    f.write(json.dumps({"scenario": item[0], "result": item[1]}) + "\n")
            if i % 50 == 0 or i == len(jobs):
                print(f"{i}/{len(jobs)} sets", file=sys.stderr, flush=True)
    return out


def settle(by: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """The repeats a 40% gain needs at run sigma 0.25, verified by simulation (module docstring)."""
    base = SCENARIOS["ab40_h25"].design
    if not by.get("ab40_h25"):
        by["ab40_h25"] = [
            r for _, r in run([("ab40_h25", base, s) for s in range(args.pilot_sets)], args.processes)
        ]
    sd, need = needed(by["ab40_h25"])
    trail = [_step(by["ab40_h25"], base.repeats, sd, need)]
    repeats: dict[str, int] = {}
    if need is None:
        return {"trail": trail, "repeats": repeats}
    first = need
    sample = _verify("ab40_h25_needed", replace(base, repeats=need), args.verify_sets, args.processes, by)
    repeats["ab40_h25_needed"] = need
    seen = {base.repeats}
    while need is not None and need not in seen and len(trail) < 6:
        seen.add(need)
        design = replace(base, repeats=need)
        pilot = sample if need == first else _pilot(design, args)
        sd, nxt = needed(pilot)
        trail.append(_step(pilot, need, sd, nxt))
        if nxt == need:
            break
        need = nxt
    if need is not None and need != first:
        _verify("ab40_h25_settled", replace(base, repeats=need), args.verify_sets, args.processes, by)
        repeats["ab40_h25_settled"] = need
    return {"trail": trail, "repeats": repeats}


def _pilot(design: Design, args: argparse.Namespace) -> list[dict[str, Any]]:
    seeds = range(100_000, 100_000 + args.pilot_sets)
    return [r for _, r in run([("pilot", design, s) for s in seeds], args.processes)]


def _verify(
    name: str, design: Design, sets: int, processes: int, by: dict[str, list[dict[str, Any]]]
) -> list:
    by[name] = [r for _, r in run([(name, design, seed) for seed in range(sets)], processes)]
    return by[name]


def _step(rows: list[dict[str, Any]], repeats: int, sd: float | None, need: int | None) -> dict[str, Any]:
    metrics = sorted({str(p["metric"]) for r in rows for p in r["power"] if p["class"] == "long"})
    return {"sets": len(rows), "repeats": repeats, "metric": "/".join(metrics), "sd": sd, "needed": need}


def _outcomes(rs: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{o} {c}" for o, c in sorted(Counter(r["outcome"] for r in rs).items()))


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.0%}" if values else "—"


def tables(by: Mapping[str, list[dict[str, Any]]], verify: Mapping[str, Any]) -> str:
    aa = [n for n in SCENARIOS if SCENARIOS[n].group != "ab" and by.get(n)]
    ab = [n for n in SCENARIOS if SCENARIOS[n].group == "ab" and by.get(n)]
    lines = [
        "A/A (four identical cells):",
        "",
        "| scenario | sets | false retunes (rate [95% CI]) | false harms (rate [95% CI]) "
        "| borderline | outcomes |",
        "|---|---|---|---|---|---|",
    ]
    for name in aa:
        rs = by[name]
        false = sum(1 for r in rs if r["outcome"] == "retune")
        harm = sum(1 for r in rs if r["material_worse"])
        lines.append(
            f"| {SCENARIOS[name].label} | {len(rs)} | {rate(false, len(rs))} | {rate(harm, len(rs))} | "
            f"{sum(r['borderline'] for r in rs)} | {_outcomes(rs)} |"
        )
    lines += [
        "",
        "A/B (C1 changed, C2 and C3 identical to B0):",
        "",
        "| scenario | repeats | sets | power: retune to C1 (rate [95% CI]) | C1 long better "
        "| C1 not shown non-inferior | false retunes | false harms | outcomes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ab:
        rs = by[name]
        n = len(rs)
        reps = verify.get("repeats", {}).get(name) or SCENARIOS[name].design.repeats
        found = sum(1 for r in rs if r["outcome"] == "retune" and r["chosen_cell"] == "C1")
        false = sum(1 for r in rs if r["outcome"] == "retune" and r["chosen_cell"] != "C1")
        better = sum(1 for r in rs if r["c1_long_better"])
        harm = sum(1 for r in rs if r["material_worse"])
        not_shown = (
            str(sum(1 for r in rs if NOT_SHOWN in r["c1_reasons"]))
            if all("c1_reasons" in r for r in rs)
            else "—"
        )
        lines.append(
            f"| {SCENARIOS[name].label} | {reps} | {n} | {rate(found, n)} | {rate(better, n)} | {not_shown} | "
            f"{false} | {harm} | {_outcomes(rs)} |"
        )
    if verify.get("trail"):
        lines += [
            "",
            "Repeats needed for 80% power at run sigma 0.25 (inference.repeats_needed, 40% change):",
            "",
        ]
        for step in verify["trail"]:
            sd = step["sd"]
            spread = "unknown" if sd is None else f"{sd:.3f} on the log scale ({math.expm1(sd):.0%})"
            lines.append(
                f"- {step['sets']} sets at {step['repeats']} repeats: the long class's run spread "
                f"({step['metric']}) {spread} -> {step['needed'] if step['needed'] is not None else 'none'} repeats"
            )
    lines += [
        "",
        "Run spread and power as each report states them (medians over the sets; "
        "`run_sd_rel` of the primary metric, the smallest change found with 80% power, and the "
        "repeats the report says a 25% change needs):",
        "",
        "| scenario | long metric | long run spread | long detectable | short metric | short run spread "
        "| short detectable | repeats for 25% (long / short) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in aa + ab:
        cols = []
        for cls in ("long", "short"):
            ps = [p for r in by[name] for p in r["power"] if p["class"] == cls]
            metrics = sorted({str(p["metric"]) for p in ps})
            cols.append(
                (
                    "/".join(metrics) or "—",
                    _median([p["run_sd_rel"] for p in ps if p.get("run_sd_rel") is not None]),
                    _median([p["detectable_rel"] for p in ps if p.get("detectable_rel") is not None]),
                    _median_int([p.get("repeats_needed") for p in ps]),
                )
            )
        (lm, ls, ld, lr), (sm, ss, sd_, sr) = cols
        lines.append(f"| {SCENARIOS[name].label} | {lm} | {ls} | {ld} | {sm} | {ss} | {sd_} | {lr} / {sr} |")
    return "\n".join(lines)


def _median_int(values: list[Any]) -> str:
    known = [v for v in values if isinstance(v, int)]
    if not known:
        return "—"
    return f"{statistics.median(known):g}" + (
        "" if len(known) == len(values) else f" (in {len(known)} of {len(values)} sets)"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sets", type=int, default=400, help="sets per run-level A/A scenario")
    ap.add_argument("--extra-sets", type=int, default=400, help="sets per request-level A/A scenario")
    ap.add_argument("--ab-sets", type=int, default=400)
    ap.add_argument("--verify-sets", type=int, default=200, help="A/B sets at the repeats needed")
    ap.add_argument("--pilot-sets", type=int, default=30, help="sets per step while the repeats settle")
    ap.add_argument("--ab10-sets", type=int, default=200, help="A/B sets at 10x the requests (0: skip)")
    ap.add_argument("--more-repeats", default="", help="comma list: sigma-0.25 A/B sets at these repeats too")
    ap.add_argument("--more-sets", type=int, default=100, help="sets per --more-repeats entry")
    ap.add_argument("--only", default="", help="comma list of scenario names")
    ap.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--raw", type=Path, default=None, help="write one JSON line per set here")
    ap.add_argument("--progress", type=Path, default=None, help="append each set's line here as it arrives")
    ap.add_argument(
        "--from-raw", type=Path, default=None, help="redraw the tables from a --raw file (or several joined)"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.progress:
        PROGRESS.append(args.progress)
    by: dict[str, list[dict[str, Any]]] = {}
    verify: dict[str, Any] = {}
    started = time.perf_counter()
    if args.from_raw:
        for line in args.from_raw.read_text().splitlines():
            row = json.loads(line)
            if str(row.get("scenario", "")).startswith("ab40_h25_x"):
                at_repeats(int(row["scenario"].rsplit("x", 1)[1]))
            if "verify" in row:
                verify = row["verify"] or verify  # several files joined: the one that settled the repeats
            else:
                by.setdefault(row["scenario"], []).append(row["result"])
    else:
        counts = {
            name: {"run": args.sets, "request": args.extra_sets, "ab": args.ab_sets}[s.group]
            for name, s in SCENARIOS.items()
        }
        counts.update(ab20_x10=args.ab10_sets)
        for r in filter(None, args.more_repeats.split(",")):
            counts[at_repeats(int(r))] = args.more_sets
        counts.pop("ab40_h25_needed")
        counts.pop("ab40_h25_settled")
        if args.only:
            keep = args.only.split(",")
            counts = {k: v for k, v in counts.items() if k in keep or k.startswith("ab40_h25_x")}
        first = [(name, SCENARIOS[name].design, seed) for name, n in counts.items() for seed in range(n)]
        for name, result in run(first, args.processes):
            by.setdefault(name, []).append(result)
        if args.verify_sets and (not args.only or "ab40_h25_needed" in args.only.split(",")):
            verify = settle(by, args)
        for rs in by.values():
            rs.sort(key=lambda r: r["seed"])
        if args.raw:
            with args.raw.open("w") as f:
                for name, rs in by.items():
                    for r in rs:
                        f.write(json.dumps({"scenario": name, "result": r}) + "\n")
                f.write(json.dumps({"verify": verify}) + "\n")
    wall = time.perf_counter() - started
    text = tables(by, verify) + "\n"
    if not args.from_raw:
        total = sum(len(rs) for rs in by.values())
        print(f"{total} sets in {wall:.0f} s with {args.processes} processes", file=sys.stderr)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
