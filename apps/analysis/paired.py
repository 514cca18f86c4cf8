"""The paired verdict: candidates against B0 on shared draws, the gain family, the decision. Pure.

build_report (report.py) hands over the derived records and the checks that need
no comparison; this module

1. finds each (mixture, rate, class) frame of B0's cohort requests;
2. sizes the bootstrap by the gain family (inference.family_resamples) and
   compares every candidate with B0 on one shared resampling per frame
   (compare.compare_group);
3. applies the gain family (family.apply) and decides (decide.decide);
4. repeats 2-3 under a second seed and marks what changes "borderline";
5. states the power of the design per class (statistics.power).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.analysis import compare, decide, family, inference
from apps.analysis.columns import RecordTable
from apps.analysis.metrics import Derived
from apps.analysis.report_types import (
    AcceptanceCheck,
    Comparison,
    Decision,
    FamilySummary,
    Statistics,
    ValidityCheck,
)
from workers.replay.records import GapHistogram


@dataclass(frozen=True)
class Sweep:
    """What build_report derived from the sweep's records, as the comparison needs it."""

    d: Derived
    table: RecordTable
    groups: Mapping[tuple[str, str], np.ndarray]  # (run key, class) -> cohort rows of the table
    done: Mapping[tuple[str, str, str, int], Mapping[str, Any]]  # (cell, mixture, rate, repeat) -> run
    run_by_key: Mapping[str, Mapping[str, Any]]
    token_hists: Mapping[tuple[str, str], GapHistogram]
    cell_ids: Sequence[str]
    baseline: str
    class_names: Sequence[str]
    combos: Sequence[tuple[str, str, int]]
    repeats: Sequence[int]


def judge_sweep(
    sweep: Sweep,
    *,
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    validity: ValidityCheck,
    acceptance: AcceptanceCheck,
    agreed: Sequence[tuple[str, str, int]],
    options: compare.CompareOptions,
    rejected: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> tuple[list[Comparison], Decision, Statistics]:
    """(comparisons, decision, statistics) of the sweep."""
    d, table, groups, done = sweep.d, sweep.table, sweep.groups, sweep.done
    run_by_key, token_hists, cell_ids = sweep.run_by_key, sweep.token_hists, sweep.cell_ids
    baseline, class_names, combos, repeats = sweep.baseline, sweep.class_names, sweep.combos, sweep.repeats
    empty = np.zeros(0, dtype=np.int64)
    agreed_pairs = {(m, r) for m, r, _ in agreed}
    primary = family.primary_metrics(classes)
    b0_cell = acceptance["cells"].get(baseline)
    b0_failures = b0_cell.get("failures", []) if b0_cell is not None else []
    # The gain family's candidates: valid and passing acceptance (family.py). A cell that breaks a
    # contract can never be adopted, so its gains are no claim the verdict rests on; and early
    # stopping (early_stop.py) relies on it: a stopped cell changes neither the family nor the draws.
    accepted = {c for c, v in acceptance["cells"].items() if v.get("passed")}
    eligible = {
        c for c in cell_ids if c != baseline and c not in set(validity["invalid_cells"]) and c in accepted
    }

    # 1-2. B0's frames; one shared resampling per (mixture, rate, class), sized by the family.
    groups_in: list[tuple[str, str, str, list[tuple[int, Mapping[str, Any]]], list[np.ndarray]]] = []
    for mix, rate in sorted({(c[0], c[1]) for c in combos}):
        base_runs = [
            (rep, done[(baseline, mix, rate, rep)]) for rep in repeats if (baseline, mix, rate, rep) in done
        ]
        for name in class_names if base_runs else []:
            frames = [np.sort(table.index[groups.get((br["key"], name), empty)]) for _, br in base_runs]
            if sum(int(f.size) for f in frames):
                groups_in.append((mix, rate, name, base_runs, frames))
    family_m = family.family_size(
        points=[
            (mix, rate, name, sum(int(f.size) for f in frames))
            for mix, rate, name, _, frames in groups_in
            if (mix, rate) in agreed_pairs
        ],
        candidates=len(eligible),
        b0_failures=b0_failures,
    )
    draws = inference.family_resamples(options.resamples, family_m, options.family_alpha)

    def compare_all(seed: int) -> tuple[list[Comparison], dict[tuple[str, str, str], Any]]:
        comps: list[Comparison] = []
        own: dict[tuple[str, str, str], Any] = {}
        for mix, rate, name, base_runs, frames in groups_in:
            sizes = [int(f.size) for f in frames]
            cands = {}
            cand_h = {}
            for cell in cell_ids:
                runs_of = [done.get((cell, mix, rate, rep)) for rep, _ in base_runs]
                if cell == baseline or all(c is None for c in runs_of):
                    continue
                cands[cell] = [
                    compare.align(f, groups.get((c["key"], name)) if c else None, table.index)
                    for f, c in zip(frames, runs_of, strict=True)
                ]
                cand_h[cell] = [token_hists.get((c["key"], name)) if c else None for c in runs_of]
            result = compare.compare_group(
                d,
                rs=compare.Resampling(sizes, draws, compare.group_seed(seed, f"{mix}|{rate}|{name}")),
                cls=name,
                base_aligned=[
                    compare.align(f, groups.get((br["key"], name)), table.index)
                    for f, (_, br) in zip(frames, base_runs, strict=True)
                ],
                cands=cands,
                obs_s=[run_by_key[br["key"]]["window"]["observation_s"] for _, br in base_runs],
                base_hists=[token_hists.get((br["key"], name)) for _, br in base_runs],
                cand_hists=cand_h,
                options=options,
            )
            own[(mix, rate, name)] = (sum(sizes), result)
            for cell in cands:
                comps.append(
                    {
                        "cell": cell,
                        "mixture": mix,
                        "rate": rate,
                        "class": name,
                        "requests": sizes,
                        "level": result.levels[0] if result.levels else None,
                        "metrics": result.metrics[cell],
                    }
                )
        return comps, own

    def judged(comps: list[Comparison]) -> tuple[FamilySummary, Decision]:
        fam = family.apply(
            comps,
            primary=primary,
            eligible_cells=eligible,
            agreed_pairs=agreed_pairs,
            b0_failures=b0_failures,
            alpha=options.family_alpha,
        )
        verdict = decide.decide(
            cells=cells,
            baseline=baseline,
            validity=validity,
            acceptance=acceptance,
            comparisons=comps,
            agreed=agreed,
            rejected=rejected,
        )
        return fam, verdict

    comparisons, b0_own = compare_all(options.seed)
    fam, decision = judged(comparisons)
    borderline = 0
    if options.seed_check and comparisons:
        # 4. The same under another seed: what changes is borderline, never silently decided.
        other_seed = options.seed + 1
        alt, _ = compare_all(other_seed)
        _, alt_decision = judged(alt)
        for c, a in zip(comparisons, alt, strict=True):
            for m, v in c["metrics"].items():
                w = a["metrics"][m]
                v["borderline"] = (v["direction"], v["noninferior"]) != (w["direction"], w["noninferior"])
                borderline += v["borderline"]
        decision["seed_check"] = {
            "seed": other_seed,
            "outcome": alt_decision["outcome"],
            "chosen_cell": alt_decision["chosen_cell"],
            "borderline": (alt_decision["outcome"], alt_decision["chosen_cell"])
            != (decision["outcome"], decision["chosen_cell"]),
        }
    statistics: Statistics = {
        "family": {**fam, "planned_size": family_m},
        "resamples": draws,
        "block": "ceil(sqrt(n)) consecutive requests in arrival order, circular, per run",
        "seed": options.seed,
        "borderline_comparisons": borderline,
        "notes": sorted(
            {v["note"] for c in comparisons for v in c["metrics"].values() if v["note"]}
            | set(fam["not_judged"])
        ),
        "power": _power(b0_own, primary, agreed_pairs, family_m, options),
    }

    return comparisons, decision, statistics


def _power(
    b0_own: Mapping[tuple[str, str, str], Any],
    primary: Mapping[str, str],
    agreed_pairs: set[tuple[str, str]],
    family_m: int,
    options: compare.CompareOptions,
) -> list[dict[str, Any]]:
    """Per agreed (mixture, rate) and class: the smallest change of the primary metric found with 80% power.

    SE of the difference = sqrt(2) x B0's own bootstrap spread (a candidate as noisy
    as B0); detectable = (z(1 - alpha/m) + z(0.8)) x SE (inference.detectable). A
    change below the material threshold is never called one, so the larger counts.
    """
    out = []
    for (mix, rate, name), (n, result) in sorted(b0_own.items()):
        if (mix, rate) not in agreed_pairs:
            continue
        level = result.levels[0] if result.levels else None
        metric = family.at_level(primary.get(name, "ttft_p99_ms"), level)
        entry: dict[str, Any] = {"mixture": mix, "rate": rate, "class": name, "requests": n, "metric": metric}
        if metric is None:
            entry["note"] = f"not enough requests to judge {name} (n={n} < {inference.judgeable_n(0.95)})"
            out.append(entry)
            continue
        b0 = result.b0[metric]
        se = math.sqrt(2.0) * result.b0_se[metric]
        mde = inference.detectable(se, alpha=options.family_alpha, family=family_m)
        effect = max(mde, compare.material_threshold(metric, b0, options))
        entry.update(
            b0=b0,
            se_diff_ms=se,
            detectable_ms=effect,
            detectable_rel=effect / b0 if math.isfinite(b0) and b0 > 0 else None,
            power=inference.POWER,
            family=family_m,
        )
        out.append(entry)
    return out
