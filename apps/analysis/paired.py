"""The paired verdict: candidates against B0 on shared draws, the gain family, the decision. Pure.

build_report (report.py) hands over the derived records and the checks that need
no comparison; this module

1. finds each (mixture, rate, class) frame of B0's cohort requests;
2. sizes the bootstrap by the gain family (inference.family_resamples) and
   compares every candidate with B0 on one shared resampling per frame
   (compare.compare_group);
3. applies the gain family (family.apply) and decides (decide.decide);
4. repeats 2-3 under a second seed and marks what changes "borderline";
5. states the power of the design per class (statistics.power), from the same
   ``settle.Design`` the decision reads to say what would settle a comparison it could not.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.analysis import compare, decide, family, inference, noise_floor, settle
from apps.analysis.columns import RecordTable
from apps.analysis.compare_options import CompareOptions
from apps.analysis.metrics import Derived
from apps.analysis.report_inputs import CellInput, ClassInput
from apps.analysis.report_types import (
    AcceptanceCheck,
    Comparison,
    Decision,
    FamilySummary,
    RunResult,
    Statistics,
    ValidityCheck,
)
from apps.analysis.resample import TailCache
from workers.replay.records import GapHistogram


@dataclass(frozen=True)
class Sweep:
    """What build_report derived from the sweep's records, as the comparison needs it."""

    d: Derived
    table: RecordTable
    groups: Mapping[tuple[str, str], np.ndarray]  # (run key, class) -> cohort rows of the table
    done: Mapping[tuple[str, str, str, int], RunResult]  # (cell, mixture, rate, repeat) -> run
    run_by_key: Mapping[str, RunResult]
    token_hists: Mapping[tuple[str, str], GapHistogram]
    cell_ids: Sequence[str]
    baseline: str
    class_names: Sequence[str]
    combos: Sequence[tuple[str, str, int]]
    repeats: Sequence[int]


# One (mixture, rate, class) point of B0's: its done runs by repeat and each run's cohort
# request indices (the frames every cell is aligned to).
Group = tuple[str, str, str, list[tuple[int, RunResult]], list[np.ndarray]]


@dataclass(frozen=True)
class _Judging:
    """What every comparison and decision of one sweep shares (judge_sweep builds it once)."""

    sweep: Sweep
    cells: Sequence[CellInput]
    validity: ValidityCheck
    acceptance: AcceptanceCheck
    agreed: Sequence[tuple[str, str, int]]
    agreed_pairs: set[tuple[str, str]]
    options: CompareOptions
    rejected: Mapping[str, Sequence[Mapping[str, Any]]] | None
    primary: dict[str, str]  # class -> its primary metric (family.primary_metrics)
    b0_failures: Sequence[Mapping[str, Any]]  # acceptance's failures of B0
    eligible: set[str]  # the gain family's candidates
    draws: int  # bootstrap replicates per point, sized by the family
    aa_cells: list[str]  # A/A control cells: B0's own arguments on B0's engine
    classes: Sequence[ClassInput] = ()  # their contracts, for the decision's words
    overload: Sequence[Mapping[str, Any]] = ()  # B0's load per point (overload.overload_points)
    by_margin: bool = False  # a search experiment: rank the confirmed cells by margin
    # Each point's tail quantiles, built under the first seed and read again under the second.
    tails: dict[tuple[str, str], TailCache] = field(default_factory=dict, compare=False)


def judge_sweep(
    sweep: Sweep,
    *,
    cells: Sequence[CellInput],
    classes: Sequence[ClassInput],
    validity: ValidityCheck,
    acceptance: AcceptanceCheck,
    agreed: Sequence[tuple[str, str, int]],
    options: CompareOptions,
    rejected: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    overload: Sequence[Mapping[str, Any]] = (),
    by_margin: bool = False,
) -> tuple[list[Comparison], Decision, Statistics]:
    """(comparisons, decision, statistics) of the sweep; ``overload``: B0's load per point
    (apps/analysis/overload.py), which the decision reads; ``by_margin``: a search experiment's
    confirmed cells, ranked by their margin (decide.decide)."""
    agreed_pairs = {(m, r) for m, r, _ in agreed}
    b0_cell = acceptance["cells"].get(sweep.baseline)
    b0_failures = b0_cell.get("failures", []) if b0_cell is not None else []
    eligible = _gain_candidates(sweep, validity, acceptance, noise_floor.control_cells(cells, sweep.baseline))
    # 1-2. B0's frames; one shared resampling per (mixture, rate, class), sized by the family.
    groups_in = _b0_frames(sweep)
    family_m = family.family_size(
        points=[
            (mix, rate, name, sum(int(f.size) for f in frames))
            for mix, rate, name, _, frames in groups_in
            if (mix, rate) in agreed_pairs
        ],
        candidates=len(eligible),
        b0_failures=b0_failures,
    )
    ctx = _Judging(
        sweep=sweep,
        cells=cells,
        validity=validity,
        acceptance=acceptance,
        agreed=agreed,
        agreed_pairs=agreed_pairs,
        options=options,
        rejected=rejected,
        primary=family.primary_metrics(classes),
        b0_failures=b0_failures,
        eligible=eligible,
        draws=inference.family_resamples(options.resamples, family_m, options.family_alpha),
        aa_cells=noise_floor.aa_cells(cells, sweep.baseline),
        classes=classes,
        overload=overload,
        by_margin=by_margin,
    )
    # The second seed's draws (step 4) need nothing of the first's: they run in a thread beside
    # them. The replicate kernel and most of numpy release the GIL, so on two cores the seeds
    # overlap; each result is the same as drawn alone (its own generator, its own arrays).
    with ThreadPoolExecutor(max_workers=1) as pool:
        second = pool.submit(_compare_all, ctx, groups_in, options.seed + 1) if options.seed_check else None
        comparisons, b0_own = _compare_all(ctx, groups_in, options.seed)
        alt = second.result() if second is not None else None
    fam, decision = _judged(ctx, comparisons, _designs(b0_own, ctx, family_m))
    borderline = 0
    if alt is not None and comparisons:
        borderline = _seed_check(ctx, alt, comparisons, decision, family_m)
    statistics: Statistics = {
        "family": {**fam, "planned_size": family_m},
        "resamples": ctx.draws,
        "block": "ceil(sqrt(n)) consecutive requests in arrival order, circular, per run",
        "seed": options.seed,
        "borderline_comparisons": borderline,
        "notes": sorted(
            {v["note"] for c in comparisons for v in c["metrics"].values() if v["note"]}
            | set(fam["not_judged"])
        ),
        "power": _power(b0_own, ctx.primary, agreed_pairs, family_m, options),
    }
    return comparisons, decision, statistics


def _gain_candidates(
    sweep: Sweep, validity: ValidityCheck, acceptance: AcceptanceCheck, controls: Collection[str] = ()
) -> set[str]:
    """The gain family's candidates: valid and passing acceptance (family.py), and no A/A control.
    A cell that breaks a contract can never be adopted, nor can a control (B0 run again), so their
    gains are no claim the verdict rests on; and early stopping (early_stop.py) relies on it: a
    stopped cell changes neither the family nor the draws."""
    accepted = {c for c, v in acceptance["cells"].items() if v.get("passed")}
    return {
        c
        for c in sweep.cell_ids
        if c != sweep.baseline
        and c not in set(validity["invalid_cells"])
        and c in accepted
        and c not in controls
    }


def _b0_frames(sweep: Sweep) -> list[Group]:
    """Step 1: every (mixture, rate, class) where B0 has done runs with cohort requests, with
    each run's request indices in order."""
    empty = np.zeros(0, dtype=np.int64)
    groups_in: list[Group] = []
    for mix, rate in sorted({(c[0], c[1]) for c in sweep.combos}):
        base_runs = [
            (rep, sweep.done[(sweep.baseline, mix, rate, rep)])
            for rep in sweep.repeats
            if (sweep.baseline, mix, rate, rep) in sweep.done
        ]
        for name in sweep.class_names if base_runs else []:
            frames = [
                np.sort(sweep.table.index[sweep.groups.get((br["key"], name), empty)]) for _, br in base_runs
            ]
            if sum(int(f.size) for f in frames):
                groups_in.append((mix, rate, name, base_runs, frames))
    return groups_in


def _compare_all(
    ctx: _Judging, groups_in: Sequence[Group], seed: int
) -> tuple[list[Comparison], dict[tuple[str, str, str], Any]]:
    """Step 2 under one seed: every candidate's comparison at every point, in plan order within a
    point, and B0's own result per point (for the power statement)."""
    comps: list[Comparison] = []
    own: dict[tuple[str, str, str], Any] = {}
    for group in groups_in:
        mix, rate, name, base_runs, frames = group
        result, results = _compare_point(ctx, group, seed)
        windows = [float(br["window"]["observation_s"]) for _, br in base_runs]
        own[(mix, rate, name)] = (sum(int(f.size) for f in frames), result, sum(windows) / len(windows))
        for cell in ctx.sweep.cell_ids:
            if cell in results:
                res, used = results[cell]
                comps.append(_comparison(ctx, group, cell, res, used))
    return comps, own


def _compare_point(
    ctx: _Judging, group: Group, seed: int
) -> tuple[compare.GroupResult, dict[str, tuple[compare.GroupResult, list[int]]]]:
    """One point: (the complete candidates' shared result, cell -> (its result, the run sizes
    compared)).

    Candidates that finished every round B0 did share one resampling and the run-level fit; one
    that finished fewer is compared on its own rounds only (a run that did not finish is absent,
    never a zero) and called material in nothing."""
    mix, rate, name, base_runs, frames = group
    sweep = ctx.sweep
    sizes = [int(f.size) for f in frames]
    runs_by_cell = {
        cell: [sweep.done.get((cell, mix, rate, rep)) for rep, _ in base_runs]
        for cell in sweep.cell_ids
        if cell != sweep.baseline
    }
    complete = [c for c, rs_ in runs_by_cell.items() if all(r is not None for r in rs_)]
    partial = [c for c, rs_ in runs_by_cell.items() if any(r is not None for r in rs_) and c not in complete]
    on = functools.partial(
        _compare_on,
        sweep=sweep,
        group=group,
        draws=ctx.draws,
        seed=seed,
        options=ctx.options,
        pool=ctx.eligible,
        tails=ctx.tails,
    )
    result = on(keep=[True] * len(base_runs), cells_in=complete, incomplete=None)
    results = {cell: (result, sizes) for cell in complete}
    for cell in partial:
        keep = [r is not None for r in runs_by_cell[cell]]
        note = (
            f"{cell} finished {sum(keep)} of {len(keep)} repeats: compared with B0 on those "
            "runs only, and no difference is called material"
        )
        one = on(keep=keep, cells_in=[cell], incomplete=note)
        results[cell] = (one, [s for s, k in zip(sizes, keep, strict=True) if k])
    return result, results


def _comparison(
    ctx: _Judging, group: Group, cell: str, res: compare.GroupResult, used: list[int]
) -> Comparison:
    """One candidate's comparison at one point, with the noise floor of its class's primary metric."""
    mix, rate, name, _, _ = group
    return {
        "cell": cell,
        "mixture": mix,
        "rate": rate,
        "class": name,
        "requests": used,
        "level": res.levels[0] if res.levels else None,
        "metrics": res.metrics[cell],
        "noise_floor": noise_floor.noise_floor(
            res,
            cell,
            family.at_level(ctx.primary.get(name, "ttft_p99_ms"), level_of(res)),
            ctx.aa_cells,
        ),
    }


def _judged(
    ctx: _Judging, comps: list[Comparison], designs: Mapping[tuple[str, str, str, str], settle.Design]
) -> tuple[FamilySummary, Decision]:
    """Step 3: the gain family marks the comparisons (Holm), then the decision reads them, with
    what B0's runs let each metric detect (``designs``) to say what would settle a comparison."""
    fam = family.apply(
        comps,
        primary=ctx.primary,
        eligible_cells=ctx.eligible,
        agreed_pairs=ctx.agreed_pairs,
        b0_failures=ctx.b0_failures,
        alpha=ctx.options.family_alpha,
    )
    verdict = decide.decide(
        cells=ctx.cells,
        baseline=ctx.sweep.baseline,
        validity=ctx.validity,
        acceptance=ctx.acceptance,
        comparisons=comps,
        agreed=ctx.agreed,
        rejected=ctx.rejected,
        classes=ctx.classes,
        designs=designs,
        margin_rel=ctx.options.noninferiority_margin_rel,
        overload=ctx.overload,
        by_margin=ctx.by_margin,
    )
    return fam, verdict


def _seed_check(
    ctx: _Judging,
    drawn: tuple[list[Comparison], Any],
    comparisons: Sequence[Comparison],
    decision: Decision,
    family_m: int,
) -> int:
    """Step 4: the same under another seed (``drawn``: _compare_all under seed + 1). What changes
    is borderline, never silently decided: each metric is marked, the decision gets
    ``seed_check``; returns how many metrics changed."""
    other_seed = ctx.options.seed + 1
    alt, alt_own = drawn
    _, alt_decision = _judged(ctx, alt, _designs(alt_own, ctx, family_m))
    borderline = 0
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
    return borderline


def _compare_on(
    *,
    sweep: Sweep,
    group: Group,
    keep: Sequence[bool],
    cells_in: Sequence[str],
    draws: int,
    seed: int,
    options: CompareOptions,
    incomplete: str | None,
    pool: Collection[str],
    tails: dict[tuple[str, str], TailCache] | None = None,
) -> compare.GroupResult:
    """compare_group of ``cells_in`` against B0 over B0's rounds where ``keep`` is true.

    The draws are seeded by the point, plus the cell when only some rounds are kept, so the
    complete candidates always share one resampling."""
    mix, rate, name, base_runs, frames = group
    kept = [i for i, k in enumerate(keep) if k]
    fr = [frames[i] for i in kept]
    brs = [base_runs[i] for i in kept]
    key = f"{mix}|{rate}|{name}" if len(kept) == len(keep) else f"{mix}|{rate}|{name}|{'|'.join(cells_in)}"
    cands = {}
    cand_h = {}
    for cell in cells_in:
        runs_of = [sweep.done.get((cell, mix, rate, rep)) for rep, _ in brs]
        cands[cell] = [
            compare.align(f, sweep.groups.get((c["key"], name)) if c else None, sweep.table.index)
            for f, c in zip(fr, runs_of, strict=True)
        ]
        cand_h[cell] = [sweep.token_hists.get((c["key"], name)) if c else None for c in runs_of]
    return compare.compare_group(
        sweep.d,
        rs=compare.Resampling([int(f.size) for f in fr], draws, compare.group_seed(seed, key)),
        cls=name,
        base_aligned=[
            compare.align(f, sweep.groups.get((br["key"], name)), sweep.table.index)
            for f, (_, br) in zip(fr, brs, strict=True)
        ],
        cands=cands,
        obs_s=[sweep.run_by_key[br["key"]]["window"]["observation_s"] for _, br in brs],
        base_hists=[sweep.token_hists.get((br["key"], name)) for _, br in brs],
        cand_hists=cand_h,
        options=options,
        incomplete=incomplete,
        pool=pool,
        tails=tails.setdefault((key, ",".join(cells_in)), TailCache(key, {})) if tails is not None else None,
    )


def level_of(result: compare.GroupResult) -> str | None:
    return result.levels[0] if result.levels else None


def _power(
    b0_own: Mapping[tuple[str, str, str], Any],
    primary: Mapping[str, str],
    agreed_pairs: set[tuple[str, str]],
    family_m: int,
    options: CompareOptions,
) -> list[dict[str, Any]]:
    """Per agreed (mixture, rate) and class: the smallest change of the primary metric found with 80% power.

    Two limits, the larger counts (a claim must pass both tests):

    - within runs: SE of the difference = sqrt(2) x B0's own bootstrap spread (a candidate as
      noisy as B0); (z(1 - alpha/m) + z(0.8)) x SE (inference.detectable);
    - between runs: the run-level model's spread (inference.rounds_detectable): Student's t
      with the fit's degrees of freedom over sqrt(2 sd^2 / R).

    A change below the material threshold is never called one. ``target_rel`` is the change the
    verdict must be able to see, the non-inferiority margin (the largest harm it lets pass
    unseen); where the design cannot find it with 80% power, ``repeats_needed`` says how many
    repeat rounds at the measured run spread would, and ``note`` says so in words.
    """
    out = []
    target = options.noninferiority_margin_rel
    for (mix, rate, name), (n, result, obs_s) in sorted(b0_own.items()):
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
        repeats = len(result.b0_repeats.get(metric, []))
        fit = result.fits.get(metric)
        design = settle.design_of(result, metric, obs_s, options, family_m)
        run_sd = design.run_sd
        effect_rel = max(design.within_rel, design.between_rel())
        floor = compare.material_threshold(metric, b0, options)
        effect = max(effect_rel * b0 if math.isfinite(b0) else math.inf, floor)
        entry.update(
            b0=b0,
            se_diff_ms=se,
            run_sd_rel=noise_floor.rel(run_sd),
            run_df=fit.df if fit is not None else None,
            repeats=repeats,
            detectable_ms=effect,
            detectable_rel=effect / b0 if math.isfinite(b0) and b0 > 0 and math.isfinite(effect) else None,
            power=inference.POWER,
            family=family_m,
            target_rel=target,
        )
        if entry["detectable_rel"] is None or entry["detectable_rel"] > target:
            cells_in_pool = len(fit.cells) if fit is not None else 2
            need = (
                inference.repeats_needed(
                    run_sd, target, cells=cells_in_pool, alpha=options.family_alpha, family=family_m
                )
                if run_sd is not None
                else None
            )
            entry["repeats_needed"] = need
            if run_sd is None:
                entry["note"] = (
                    f"the spread between runs is unknown ({repeats} repeat{'s' if repeats != 1 else ''}): "
                    f"this design cannot show that a {target:.0%} change of {name} {metric} is found"
                )
            elif need is None:
                entry["note"] = (
                    f"runs spread by {math.expm1(run_sd):.0%}: no number of repeats up to 200 finds a "
                    f"{target:.0%} change of {name} {metric} with 80% power"
                )
            else:
                entry["note"] = (
                    f"runs spread by {math.expm1(run_sd):.0%}: finding a {target:.0%} change of {name} "
                    f"{metric} with 80% power takes at least {need} repeats (this design has {repeats})"
                )
        out.append(entry)
    return out


def _designs(
    b0_own: Mapping[tuple[str, str, str], Any], ctx: _Judging, family_m: int
) -> dict[tuple[str, str, str, str], settle.Design]:
    """(mixture, rate, class, metric) -> settle.Design, for every latency metric (lower is better,
    in ms) B0 has a value of at an agreed point: what the decision may name as unsettled."""
    out = {}
    for (mix, rate, name), (_, result, obs_s) in b0_own.items():
        if (mix, rate) not in ctx.agreed_pairs:
            continue
        for metric in result.b0:
            if metric.endswith("_ms") and metric in result.b0_se:
                out[(mix, rate, name, metric)] = settle.design_of(
                    result, metric, obs_s, ctx.options, family_m
                )
    return out
