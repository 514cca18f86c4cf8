"""The whole experiment report, from plain inputs. Pure: the database service and tests both call it.

Inputs: typed dicts, declared in apps/analysis/report_inputs.py (what each key means, which
are optional), as the database loader (apps/analysis/services.py) builds them from the models:

- experiment (ExperimentInput), cells (CellInput), classes (ClassInput with the contract),
  runs (RunInput: ``key`` is the run id the records carry).
- table: a RecordTable of every run's records.
- samples: run key -> its MetricSampleInput dicts (optional).
- token_hists / chunk_hists: (run key, class) -> merged cohort GapHistogram,
  when the caller merged them already (else they come from the table).
- rollback: RollbackInput, {"exists": bool, "baseline": str | None}.
- quality_probes: QualityProbeInput, one per done sweep run that ran the probe.
- rehearsals: cell -> its rollback rehearsals: the latest attempt's {"run", "status",
  "reason", "measures"} (measures from apps/analysis/rehearsal_measures.py) and ``attempts``, every
  attempt with its outcome (report_types.RehearsalEntry); rehearse: whether the spec asks for
  one. Check 4 judges every attempt of the chosen cell (checks.recovery_check); rehearsal runs
  are not in ``runs``.

The output is JSON-serialisable: no NaN or infinity anywhere (a value that
is not a finite number is null, with a flag saying why).

The options (``ReportOptions``) and the points they judge (``sweep_combos``,
``agreed_combos``) are apps/analysis/report_options.py; steps 1-3 (each run's and each pooled
point's metrics) are apps/analysis/measured.py; the four checks are apps/analysis/validity.py
(check 1) and apps/analysis/checks.py.

Over 500 lines on purpose: :func:`build_report` is the report's one sequence of steps, and the
small functions it calls for each step (``_measure``, ``_uncompared_checks``, ``_paired_sweep``,
``_explained``, ``_pools``, the costs) sit beside it so the order of the steps reads in one file.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.analysis import (
    cost,
    findings,
    lengths,
    measured,
    metrics,
    paired,
    pool_sizing,
    prefix_cache,
    quality_verdict,
    rejections,
    tail_bound,
    ttft_parts,
)
from apps.analysis.checks import acceptance_check, recovery_check, scenario_check
from apps.analysis.columns import RecordTable
from apps.analysis.decide import ISOLATE
from apps.analysis.early_stop import settled_by
from apps.analysis.overload import RunLoad, overload_points, run_load
from apps.analysis.report_inputs import (
    CellInput,
    ClassCapacity,
    ClassInput,
    ExperimentInput,
    MetricSampleInput,
    QualityProbeInput,
    RollbackInput,
    RunInput,
)
from apps.analysis.report_options import ReportOptions
from apps.analysis.report_types import (
    AcceptanceCheck,
    Aggregate,
    Checks,
    Comparison,
    Decision,
    DiffPoint,
    Finding,
    OverloadPoint,
    PoolSizing,
    QualityCheck,
    RecordsSummary,
    RecoveryCheck,
    RehearsalEntry,
    Report,
    ReportCell,
    ReportCharts,
    ReportExperiment,
    RunResult,
    SkippedCell,
    StoppedBy,
    TailBound,
    TtftParts,
    ValidityCheck,
)
from apps.analysis.validators import ValidatorBudget
from apps.analysis.validity import validity_check
from workers.replay.records import GapHistogram

REPORT_FORMAT = "tailtune-report"
REPORT_VERSION = 1


def jsonable(value: Any) -> Any:
    """numpy scalars to Python, non-finite floats to None, tuples to lists."""
    # The exact built-in types first (a seed sweep's report is ~100,000 values): the same results
    # as the general rules below, which subclasses and numpy types still take.
    kind = type(value)
    if kind is str or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int or kind is bool:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): jsonable(v) for k, v in value.items()}
    if kind is list:
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


@dataclass(frozen=True)
class _Uncompared:
    """Step 4: the checks that need no comparison, and the decision table's rejecting rows."""

    validity: ValidityCheck
    acceptance: AcceptanceCheck
    quality: QualityCheck
    rejected: dict[str, list[dict[str, Any]]]


def _uncompared_checks(
    *,
    experiment: ExperimentInput,
    classes: Sequence[ClassInput],
    plan: measured.Plan,
    run_results: Sequence[RunResult],
    points: measured.SweepPoints,
    aggregates: Sequence[Aggregate],
    opts: ReportOptions,
    quality_probes: Sequence[QualityProbeInput],
    validator_budget: ValidatorBudget | None,
) -> _Uncompared:
    """Validity, and acceptance pooled over the repeats with each class's quality contract."""
    cells, baseline = plan.cells, plan.baseline
    skipped = {
        (r["cell"], r["mixture"], r["rate"], r["repeat"]): r["reason"]
        for r in points.runs
        if r["status"] == "skipped" and r["reason"]
    }
    # Points early stopping settled: their cell is stopped (acceptance fails it), not invalid.
    stopped = {point for point, why in skipped.items() if settled_by(why)}
    validity = validity_check(
        experiment=experiment,
        cells=cells,
        baseline=baseline,
        run_results=run_results,
        combos=points.combos,
        stopped=stopped,
    )
    acceptance = acceptance_check(
        cells=cells,
        classes=classes,
        aggregates=aggregates,
        agreed=points.agreed,
        alpha=opts.compare.contract_alpha,
        skipped=skipped,
    )
    # Check 2 also holds each class to its quality contract (apps/analysis/quality_verdict.py).
    probe_result = quality_verdict.quality_check(
        cells=cells, classes=classes, baseline=baseline, probes=quality_probes, budget=validator_budget
    )
    quality_verdict.apply_to_acceptance(acceptance, probe_result, baseline=baseline)
    # The decision table's rejecting rows, which the decision reads.
    rejected = rejections.rejections(
        cells=cells,
        classes=classes,
        baseline=baseline,
        aggregates=aggregates,
        run_results=run_results,
        agreed=points.agreed,
        max_preemption_share=opts.max_preemption_share,
    )
    return _Uncompared(validity=validity, acceptance=acceptance, quality=probe_result, rejected=rejected)


def _paired_sweep(
    plan: measured.Plan,
    points: measured.SweepPoints,
    cohorts: measured.Cohorts,
    run_by_key: Mapping[str, RunResult],
    table: RecordTable,
) -> paired.Sweep:
    """What the paired comparison (steps 5-6) needs of the sweep's derived records."""
    return paired.Sweep(
        d=cohorts.d,
        table=table,
        groups=cohorts.groups,
        done=points.done,
        run_by_key=run_by_key,
        token_hists=cohorts.token_hists,
        cell_ids=plan.cell_ids,
        baseline=plan.baseline,
        class_names=plan.class_names,
        combos=points.combos,
        repeats=points.repeats,
    )


def _recovery(
    decision: Decision,
    baseline: str,
    rollback: RollbackInput | None,
    *,
    rehearse: bool,
    rehearsals: Mapping[str, RehearsalEntry] | None,
) -> RecoveryCheck:
    """Check 4 for the cell the decision chose: its rollback rehearsals, and the manifest."""
    return recovery_check(
        rollback,
        chosen_cell=decision.get("chosen_cell"),
        baseline=baseline,
        rehearse=rehearse,
        rehearsal=(rehearsals or {}).get(str(decision.get("chosen_cell"))),
    )


def _identity(experiment: ExperimentInput) -> ReportExperiment:
    return {
        "id": experiment.get("id"),
        "name": experiment.get("name"),
        "model_revision": experiment.get("model_revision"),
        "tokenizer_revision": experiment.get("tokenizer_revision"),
    }


def _records_summary(table: RecordTable, cohorts: measured.Cohorts, plan: measured.Plan) -> RecordsSummary:
    """How many records there are, how many in a cohort, and the classes no contract names."""
    return {
        "total": len(table),
        "cohort": int(np.count_nonzero(cohorts.d.cohort)),
        "unknown_classes": sorted({c for (_, c) in cohorts.groups} - set(plan.class_names)),
    }


def build_report(
    *,
    experiment: ExperimentInput,
    cells: Sequence[CellInput],
    classes: Sequence[ClassInput],
    runs: Sequence[RunInput],
    table: RecordTable,
    samples: Mapping[str, Sequence[MetricSampleInput]] | None = None,
    token_hists: Mapping[tuple[str, str], GapHistogram] | None = None,
    chunk_hists: Mapping[tuple[str, str], GapHistogram] | None = None,
    rollback: RollbackInput | None = None,
    options: Mapping[str, Any] | ReportOptions | None = None,
    scenario_verdicts: Mapping[str, Mapping[str, Any]] | None = None,
    rehearsals: Mapping[str, RehearsalEntry] | None = None,
    rehearse: bool = True,
    stop_reasons: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None,
    quality_probes: Sequence[QualityProbeInput] | None = None,
    validator_budget: ValidatorBudget | None = None,
    class_capacities: Mapping[str, Mapping[str, ClassCapacity]] | None = None,
) -> Report:
    """Per-run metrics, pooled aggregates, paired comparisons, checks, findings and the decision.

    1. Derive every record's outcome and latencies from its planned arrival.
    2. Per run and class: counts, censored percentiles, goodput, contract verdict.
    3. Per (cell, mixture, rate, class): repeats pooled, with their variation.
    4. Validity, and acceptance pooled over the repeats (exact binomial tests).
    5. Per candidate, (mixture, rate) and class: paired block bootstrap against B0,
       the gain family (Holm), the decision, and the same under a second seed (paired.py).
    6. The other checks; where each class's TTFT goes and what bounds its tail (ttft_parts.py,
       tail_bound.py), the findings; the prefix cache's hit rates; chart-ready aggregates.
    7. When the decision is isolate: each class's pool, sized from ``class_capacities`` (cell ->
       class -> its measured capacity alone, pool_capacity.class_capacities) at the agreed rates.
    """
    opts = options if isinstance(options, ReportOptions) else ReportOptions.from_mapping(options)
    m = _measure(experiment, cells, classes, runs, table, samples, token_hists, chunk_hists, opts)
    plan, windows, natural, cohorts = m.plan, m.windows, m.natural, m.cohorts
    run_results, run_by_key, points, aggregates = m.run_results, m.run_by_key, m.points, m.aggregates
    # B0's own load: did arrivals outrun completions through the window (apps/analysis/overload.py)?
    overloaded = _overload(experiment, plan, points, table, windows, run_by_key)
    before = _uncompared_checks(
        experiment=experiment,
        classes=classes,
        plan=plan,
        run_results=run_results,
        points=points,
        aggregates=aggregates,
        opts=opts,
        quality_probes=quality_probes or [],
        validator_budget=validator_budget,
    )
    # 5-6. The paired comparison, the gain family, the decision and the seed check.
    comparisons, decision, statistics = paired.judge_sweep(
        _paired_sweep(plan, points, cohorts, run_by_key, table),
        cells=plan.cells,
        classes=classes,
        validity=before.validity,
        acceptance=before.acceptance,
        agreed=points.agreed,
        options=opts.compare,
        rejected=before.rejected,
        overload=overloaded,
        by_margin=bool(experiment.get("search")),
    )
    # 6. The other checks, the findings, the report.
    checks: Checks = {
        "validity": before.validity,
        "acceptance": before.acceptance,
        "quality": before.quality,
        "failure_scenarios": scenario_check(run_results, scenario_verdicts),
        "recovery": _recovery(decision, plan.baseline, rollback, rehearse=rehearse, rehearsals=rehearsals),
    }
    parts, bounds, found, prefix = _explained(
        experiment=experiment,
        plan=plan,
        points=points,
        cohorts=cohorts,
        runs=runs,
        classes=classes,
        aggregates=aggregates,
        run_results=run_results,
        comparisons=comparisons,
        invalid_cells=before.validity["invalid_cells"],
        stall_ratio=opts.stall_ratio,
        overloaded=overloaded,
    )
    report: Report = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "experiment": _identity(experiment),
        "options": opts.to_json(),
        "baseline": plan.baseline,
        "cells": [_report_cell(c) for c in plan.cells],
        "classes": [dict(c) for c in classes],
        "records": _records_summary(table, cohorts, plan),
        "runs": run_results,
        "skipped": skipped_cells(run_results),
        "overload": overloaded,
        "aggregates": aggregates,
        "comparisons": comparisons,
        "checks": checks,
        "findings": found,
        "statistics": statistics,
        "decision": decision,
        "output_mode": "natural" if natural else "exact",
        "stop_reasons": lengths.stop_reasons_by_cell(run_results, stop_reasons or {}),
        "costs": _costs(experiment, opts, cells=plan.cells, run_results=run_results, agreed=points.agreed),
        # Each rehearsed cell's attempts, the latest one's measures in full (apps/analysis/rehearsal_measures.py).
        "rehearsals": dict(rehearsals or {}),
        "ttft_parts": parts,
        "tail_bounds": bounds,
        "prefix_cache": prefix,
        "charts": charts(
            cell_ids=plan.cell_ids, aggregates=aggregates, comparisons=comparisons, run_results=run_results
        ),
    }
    if decision["outcome"] == ISOLATE:  # 7.
        report["pools"] = _pools(
            experiment, plan, classes, points, aggregates, before, class_capacities, opts
        )
    return jsonable(report)


@dataclass(frozen=True)
class _Measured:
    """Steps 1-3: the plan, each run's window and derived records, its result, and the pooled cells."""

    plan: measured.Plan
    windows: dict[str, metrics.Window]
    natural: bool
    cohorts: measured.Cohorts
    run_results: list[RunResult]
    run_by_key: dict[str, RunResult]
    points: measured.SweepPoints
    aggregates: list[Aggregate]


def _measure(
    experiment: ExperimentInput,
    cells: Sequence[CellInput],
    classes: Sequence[ClassInput],
    runs: Sequence[RunInput],
    table: RecordTable,
    samples: Mapping[str, Sequence[MetricSampleInput]] | None,
    token_hists: Mapping[tuple[str, str], GapHistogram] | None,
    chunk_hists: Mapping[tuple[str, str], GapHistogram] | None,
    opts: ReportOptions,
) -> _Measured:
    plan = measured.plan_of(cells, classes)
    windows = {str(r["key"]): metrics.run_window(r) for r in runs}
    natural = experiment.get("output_mode") == "natural"
    cohorts = measured.derive_cohorts(
        table, windows, plan, natural=natural, token_hists=token_hists, chunk_hists=chunk_hists
    )
    run_results = [
        measured.run_result(r, windows[str(r["key"])], cohorts, plan, (samples or {}).get(str(r["key"]), []))
        for r in runs
    ]
    run_by_key = {r["key"]: r for r in run_results}
    points = measured.sweep_points(run_results, experiment, opts)
    aggregates = measured.pooled(plan, points, cohorts, run_by_key, table, natural=natural)
    return _Measured(plan, windows, natural, cohorts, run_results, run_by_key, points, aggregates)


def _pools(
    experiment: ExperimentInput,
    plan: measured.Plan,
    classes: Sequence[ClassInput],
    points: measured.SweepPoints,
    aggregates: Sequence[Aggregate],
    before: _Uncompared,
    class_capacities: Mapping[str, Mapping[str, ClassCapacity]] | None,
    opts: ReportOptions,
) -> PoolSizing:
    """Step 7: each class's pool when the decision is isolate (apps/analysis/pool_sizing.py)."""
    return pool_sizing.pool_sizing(
        experiment=experiment,
        cells=plan.cells,
        classes=classes,
        baseline=plan.baseline,
        agreed=points.agreed,
        runs=points.runs,
        aggregates=aggregates,
        acceptance=before.acceptance["cells"],
        invalid_cells=before.validity["invalid_cells"],
        capacities=class_capacities,
        headroom=opts.pool_headroom,
    )


def _explained(
    *,
    experiment: ExperimentInput,
    plan: measured.Plan,
    points: measured.SweepPoints,
    cohorts: measured.Cohorts,
    runs: Sequence[RunInput],
    classes: Sequence[ClassInput],
    aggregates: Sequence[Aggregate],
    run_results: Sequence[RunResult],
    comparisons: Sequence[Comparison],
    invalid_cells: Sequence[str],
    stall_ratio: float,
    overloaded: Sequence[OverloadPoint],
) -> tuple[TtftParts, list[TailBound], list[Finding], dict[str, Any]]:
    """Step 6's explanations: where each class's TTFT goes, what bounds each class's tail at the
    agreed points, the findings that read both, and the prefix cache's hit rates beside them."""
    parts = ttft_parts.ttft_parts(plan=plan, points=points, cohorts=cohorts, runs=runs)
    bounds = tail_bound.tail_bounds(
        cells=plan.cells,
        classes=classes,
        agreed=points.agreed,
        parts_rows=parts["rows"],
        aggregates=aggregates,
        run_results=run_results,
        invalid_cells=invalid_cells,
    )
    found = findings.findings(
        cells=plan.cells,
        classes=classes,
        baseline=plan.baseline,
        run_results=run_results,
        aggregates=aggregates,
        comparisons=comparisons,
        stall_ratio=stall_ratio,
        invalid_cells=invalid_cells,
        tail_bounds=bounds,
        overload=overloaded,
    )
    prefix = prefix_cache.prefix_cache(
        experiment=experiment,
        cell_ids=plan.cell_ids,
        baseline=plan.baseline,
        run_results=run_results,
        aggregates=aggregates,
        comparisons=comparisons,
        parts_rows=parts["rows"],
    )
    return parts, bounds, found, prefix


def _overload(
    experiment: ExperimentInput,
    plan: measured.Plan,
    points: measured.SweepPoints,
    table: RecordTable,
    windows: Mapping[str, metrics.Window],
    run_by_key: Mapping[str, RunResult],
) -> list[OverloadPoint]:
    """Per (mixture, rate), B0's done sweep runs measured for overload (overload.overload_points)."""
    code = {key: i for i, key in enumerate(table.run_keys)}
    loads: dict[tuple[str, str], list[RunLoad]] = defaultdict(list)
    rates: dict[tuple[str, str], float | None] = {}
    for (cell, mix, rate, _), run in sorted(points.done.items()):
        if cell != plan.baseline:
            continue
        key = run["key"]
        rows = np.flatnonzero(table.run == code[key]) if key in code else np.zeros(0, dtype=np.int64)
        waiting = (run_by_key[key]["server"].get("gauges", {}).get("waiting") or {}).get("series") or []
        loads[(mix, rate)].append(run_load(key, table, rows, windows[key], waiting))
        rates.setdefault((mix, rate), run.get("rate_rps"))
    return overload_points(
        loads,
        rates_rps=rates,
        capacities=experiment.get("capacities") or {},
        rates_source=experiment.get("rates_source"),
        agreed={(m, r) for m, r, _ in points.agreed},
    )


def _report_cell(c: CellInput) -> ReportCell:
    """A cell as the report lists it; ``control`` only on an A/A control cell."""
    cell: ReportCell = {"cell_id": c["cell_id"], "role": c.get("role"), "args": c.get("args") or {}}
    if c.get("control"):
        cell["control"] = True
    return cell


def skipped_cells(run_results: Sequence[RunResult]) -> list[SkippedCell]:
    """The cells whose sweep runs were skipped, in the runs' order: cell, the reason, the skipped
    runs, and, where early stopping stopped the cell, ``settled_by``: the run its reason names
    with that run's point, and the class, contract key and that run's [over, judged] count."""
    out: dict[str, SkippedCell] = {}
    by_key = {r["key"]: r for r in run_results}
    for r in run_results:
        if r["status"] == "skipped" and not r["scenario"]:
            entry = out.get(r["cell"])
            if entry is None:
                entry = out[r["cell"]] = {"cell": r["cell"], "reason": r.get("reason") or "", "runs": []}
                named = settled_by(entry["reason"])
                if named is not None:
                    entry["settled_by"] = _settled_by(*named, by_key.get(named[0]))
            entry["runs"].append(r["key"])
    return list(out.values())


def _settled_by(run: str, cls: str, key: str, result: RunResult | None) -> StoppedBy:
    """What settled a stopped cell, as early stopping recorded it, with the named run's own
    point and count from this report (None where the report does not hold that run)."""
    metrics_of = result["classes"].get(cls) if result is not None else None
    over = ((metrics_of or {}).get("over_limit") or {}).get(key)
    return {
        "run": run,
        "mixture": result["mixture"] if result else None,
        "rate": result["rate"] if result else None,
        "repeat": result["repeat"] if result else None,
        "class": cls,
        "metric": key,
        "run_over": [int(over[0]), int(over[1])] if over else None,
    }


def _costs(
    experiment: ExperimentInput,
    opts: ReportOptions,
    *,
    cells: Sequence[CellInput],
    run_results: Sequence[RunResult],
    agreed: Sequence[tuple[str, str, int]],
) -> dict[str, Any]:
    """Cost per 1M output tokens per cell: the spec's price, else the host's, else none."""
    price, source = opts.usd_per_gpu_hour, "spec (analysis.usd_per_gpu_hour)"
    host_price = experiment.get("host_usd_per_gpu_hour")
    if price is None and host_price is not None:
        price = float(host_price)
        source = f"host {experiment.get('host_name') or ''} (TAILTUNE_USD_PER_GPU_HOUR)".replace("  ", " ")
    if price is None:
        source = "not given: set analysis.usd_per_gpu_hour or TAILTUNE_USD_PER_GPU_HOUR on the host"
    return cost.cell_costs(
        cells=cells,
        run_results=run_results,
        agreed=agreed,
        usd_per_gpu_hour=price,
        price_source=source,
        gpus_per_server=int(experiment.get("tensor_parallel_size") or 1),
    )


def charts(
    *,
    cell_ids: Sequence[str],
    aggregates: Sequence[Aggregate],
    comparisons: Sequence[Comparison],
    run_results: Sequence[RunResult],
) -> ReportCharts:
    """Small aggregates the UI plots directly (it never reads records)."""
    per_group: dict[tuple[str, str, str], dict[str, Any]] = {}
    for a in aggregates:
        k = (a["mixture"], a["rate"], a["class"])
        g = per_group.setdefault(
            k,
            {
                "mixture": k[0],
                "rate": k[1],
                "class": k[2],
                "cells": [],
                **{h: [] for h in measured.HEADLINE},
                "censored": {h: [] for h in measured.HEADLINE},
            },
        )
        g["cells"].append(a["cell"])
        head = measured.headline(a["pooled"])
        for h in measured.HEADLINE:
            g[h].append(head[h] if math.isfinite(head[h]) else None)
            g["censored"][h].append(math.isinf(head[h]))
    forest: list[DiffPoint] = [
        {
            "cell": c["cell"],
            "mixture": c["mixture"],
            "rate": c["rate"],
            "class": c["class"],
            "metric": m,
            "diff": v["diff"],
            "ci": v["ci"],
            "direction": v["direction"],
        }
        for c in comparisons
        for m, v in sorted(c["metrics"].items())
    ]
    preempt: dict[str, list[float]] = defaultdict(list)
    for r in run_results:
        p = r["server"]["counters"].get("preemptions")
        if not r["scenario"] and r["status"] == "done" and p is not None:
            preempt[r["cell"]].append(p)
    return {
        "class_metrics": [per_group[k] for k in sorted(per_group)],
        "diffs": forest,
        "preemptions_per_run": [
            {"cell": c, "mean": (sum(preempt[c]) / len(preempt[c])) if preempt.get(c) else None}
            for c in cell_ids
        ],
    }
