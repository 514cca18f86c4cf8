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
  "reason", "measures"} (measures from apps/analysis/rehearsal.py) and ``attempts``, every
  attempt with its outcome (report_types.RehearsalEntry); rehearse: whether the spec asks for
  one. Check 4 judges every attempt of the chosen cell (checks.recovery_check); rehearsal runs
  are not in ``runs``.

The output is JSON-serialisable: no NaN or infinity anywhere (a value that
is not a finite number is null, with a flag saying why).

The options (``ReportOptions``) and the points they judge (``sweep_combos``,
``agreed_combos``) are apps/analysis/report_options.py, importable from here too;
the four checks are apps/analysis/checks.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.analysis import cost, findings, lengths, metrics, paired, quality, rejections
from apps.analysis.checks import acceptance_check, recovery_check, scenario_check, validity_check
from apps.analysis.columns import RecordTable
from apps.analysis.report_inputs import (
    CellInput,
    ClassInput,
    ExperimentInput,
    MetricSampleInput,
    QualityProbeInput,
    RollbackInput,
    RunInput,
)
from apps.analysis.report_options import ReportOptions, agreed_combos, sweep_combos
from apps.analysis.report_types import (
    AcceptanceCheck,
    Aggregate,
    Checks,
    ClassMetrics,
    Comparison,
    Decision,
    DiffPoint,
    QualityCheck,
    RecordsSummary,
    RecoveryCheck,
    RehearsalEntry,
    Report,
    ReportCharts,
    ReportExperiment,
    RunResult,
    SkippedCell,
    ValidityCheck,
)
from apps.analysis.server import server_metrics
from apps.analysis.validators import ValidatorBudget
from workers.replay.records import GapHistogram

REPORT_FORMAT = "tailtune-report"
REPORT_VERSION = 1
HEADLINE = ("goodput_rps", "contract_share", "ttft_p99", "e2e_p99", "max_stall_p99", "itl_p99")


def jsonable(value: Any) -> Any:
    """numpy scalars to Python, non-finite floats to None, tuples to lists."""
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


def _merge(hists: Sequence[GapHistogram | None]) -> GapHistogram | None:
    present = [h for h in hists if h is not None]
    if not present:
        return None
    out = GapHistogram()
    for h in present:
        out.merge(h)
    return out


def _headline(m: ClassMetrics) -> dict[str, float]:
    return {
        "goodput_rps": m["goodput_rps"] if m["goodput_rps"] is not None else math.nan,
        "contract_share": m["contract_share"] if m["contract_share"] is not None else math.nan,
        "ttft_p99": metrics.pvalue(m["ttft_ms"]["p99"]),
        "e2e_p99": metrics.pvalue(m["e2e_ms"]["p99"]),
        "max_stall_p99": metrics.pvalue(m["max_stall_ms"]["p99"]),
        "itl_p99": m["itl_ms"]["p99"] if m["itl_ms"]["p99"] is not None else math.inf,
    }


def _variation(per_repeat: Sequence[ClassMetrics]) -> dict[str, Any]:
    out = {}
    for name in HEADLINE:
        vals = [_headline(m)[name] for m in per_repeat]
        finite = [v for v in vals if math.isfinite(v)]
        out[name] = {
            "repeats": [v if math.isfinite(v) else None for v in vals],
            "censored": sum(1 for v in vals if math.isinf(v)),
            "mean": float(np.mean(finite)) if finite else None,
            "std": float(np.std(finite)) if len(finite) > 1 else None,
            "min": min(finite) if finite else None,
            "max": max(finite) if finite else None,
        }
    return out


@dataclass(frozen=True)
class _Plan:
    """The cells in plan order, B0 among them, and each class's contract."""

    cells: list[CellInput]
    cell_ids: list[str]
    baseline: str
    class_names: list[str]
    contracts: dict[str, metrics.Contract]


def _plan(cells: Sequence[CellInput], classes: Sequence[ClassInput]) -> _Plan:
    """Cells sorted by plan position (then id); exactly one baseline; every class's contract."""
    ordered = sorted(cells, key=lambda c: (int(c.get("position", 0)), str(c["cell_id"])))
    cell_ids = [c["cell_id"] for c in ordered]
    if len(set(cell_ids)) != len(cell_ids):
        raise ValueError("cell ids must be unique")
    baselines = [c["cell_id"] for c in ordered if c.get("role") == "baseline"]
    if len(baselines) != 1:
        raise ValueError(f"expected exactly one baseline cell, got {len(baselines)}")
    contracts = {c["name"]: metrics.Contract.from_mapping(c) for c in classes}
    return _Plan(
        cells=ordered,
        cell_ids=cell_ids,
        baseline=baselines[0],
        class_names=[c["name"] for c in classes],
        contracts=contracts,
    )


@dataclass(frozen=True)
class _Cohorts:
    """Every record derived once, the cohort rows of each (run key, class), and their merged
    gap histograms (the caller's, when it merged them already)."""

    d: metrics.Derived
    groups: dict[tuple[str, str], np.ndarray]
    token_hists: Mapping[tuple[str, str], GapHistogram]
    chunk_hists: Mapping[tuple[str, str], GapHistogram]
    empty: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def rows(self, key: str, name: str) -> np.ndarray:
        return self.groups.get((key, name), self.empty)


def _cohorts(
    table: RecordTable,
    windows: Mapping[str, metrics.Window],
    plan: _Plan,
    *,
    natural: bool,
    token_hists: Mapping[tuple[str, str], GapHistogram] | None,
    chunk_hists: Mapping[tuple[str, str], GapHistogram] | None,
) -> _Cohorts:
    """Step 1: derive every record's outcome and latencies, then group the cohort rows by
    (run, class) with one sort."""
    d = metrics.derive(table, windows, plan.contracts, natural=natural)
    groups = metrics.cohort_groups(d)
    if token_hists is None:
        token_hists = metrics.cohort_histograms(d, which="token_gaps")
    if chunk_hists is None:
        chunk_hists = metrics.cohort_histograms(d, which="chunk_gaps")
    return _Cohorts(d=d, groups=groups, token_hists=token_hists, chunk_hists=chunk_hists)


def _run_result(
    r: RunInput,
    w: metrics.Window,
    cohorts: _Cohorts,
    plan: _Plan,
    samples: Sequence[MetricSampleInput],
) -> RunResult:
    """Step 2: one run's identity, window and metrics per class."""
    key = str(r["key"])
    per_class = {
        name: metrics.class_metrics(
            cohorts.d,
            cohorts.rows(key, name),
            contract=plan.contracts[name],
            observation_s=w.observation_s,
            token_hist=cohorts.token_hists.get((key, name)),
            chunk_hist=cohorts.chunk_hists.get((key, name)),
        )
        for name in plan.class_names
    }
    all_rows = np.concatenate([cohorts.rows(key, n) for n in plan.class_names])
    total_tokens = sum(m["output_tokens"] for m in per_class.values())
    return {
        "key": key,
        "run_id": key,
        "cell": r["cell"],
        "mixture": r["mixture"],
        "rate": r["rate"],
        "rate_rps": r.get("rate_rps"),
        "repeat": int(r["repeat"]),
        "scenario": r.get("scenario") or "",
        "status": r["status"],
        # Why it ended so: a failure's cause, or early stopping's "cannot be accepted (...)".
        "reason": r.get("reason") or "",
        "trace_sha256": r.get("trace_sha256") or "",
        "corpus_sha256": r.get("corpus_sha256") or "",
        "hardware_id": r.get("hardware_id") or "",
        "model_revision": r.get("model_revision") or "",
        "tokenizer_revision": r.get("tokenizer_revision") or "",
        "image_digest": r.get("image_digest") or "",
        "vllm_version": r.get("vllm_version") or "",
        "effective_args": r.get("effective_args"),
        "generation": r.get("generation"),
        "dispatch_lag_p99_ms": r.get("dispatch_lag_p99_ms"),
        "window": {
            "warmup_s": float(r["warmup_s"]),
            "observation_s": w.observation_s,
            "drain_deadline_s": float(r["drain_deadline_s"]),
        },
        "lateness_ms": metrics.plain_stats(cohorts.d.lateness_ms[all_rows]),
        # Absent, never 0, for a run that produced no records in its window.
        "tokens_per_s": round(total_tokens / w.observation_s, 6)
        if all_rows.size and w.observation_s > 0
        else None,
        "classes": per_class,
        "server": server_metrics(samples),
    }


@dataclass(frozen=True)
class _SweepPoints:
    """The sweep's runs (failure scenarios apart), its (mixture, rate, repeat) points, those
    judged (``agreed``), and the first done run of each (cell, mixture, rate, repeat)."""

    runs: list[RunResult]
    combos: list[tuple[str, str, int]]
    repeats: list[int]
    agreed: list[tuple[str, str, int]]
    done: dict[tuple[str, str, str, int], RunResult]


def _sweep_points(
    run_results: Sequence[RunResult], experiment: ExperimentInput, opts: ReportOptions
) -> _SweepPoints:
    sweep = [r for r in run_results if not r["scenario"]]
    combos = sweep_combos(sweep, experiment)
    done: dict[tuple[str, str, str, int], RunResult] = {}
    for r in sweep:
        if r["status"] == "done":
            done.setdefault((r["cell"], r["mixture"], r["rate"], r["repeat"]), r)
    return _SweepPoints(
        runs=sweep,
        combos=combos,
        repeats=sorted({r["repeat"] for r in sweep}),
        agreed=agreed_combos(combos, opts),
        done=done,
    )


def _aggregates(
    plan: _Plan,
    points: _SweepPoints,
    cohorts: _Cohorts,
    run_by_key: Mapping[str, RunResult],
    table: RecordTable,
    *,
    natural: bool,
) -> list[Aggregate]:
    """Step 3: per (cell, mixture, rate, class), the done repeats pooled, with their variation."""
    aggregates: list[Aggregate] = []
    for cell in plan.cell_ids:
        for mix, rate in sorted({(c[0], c[1]) for c in points.combos}):
            reps = [
                points.done[(cell, mix, rate, rep)]
                for rep in points.repeats
                if (cell, mix, rate, rep) in points.done
            ]
            if not reps:
                continue
            obs = sum(run_by_key[x["key"]]["window"]["observation_s"] for x in reps)
            for name in plan.class_names:
                pooled_rows = np.concatenate([cohorts.rows(x["key"], name) for x in reps])
                pooled = metrics.class_metrics(
                    cohorts.d,
                    pooled_rows,
                    contract=plan.contracts[name],
                    observation_s=obs,
                    token_hist=_merge([cohorts.token_hists.get((x["key"], name)) for x in reps]),
                    chunk_hist=_merge([cohorts.chunk_hists.get((x["key"], name)) for x in reps]),
                )
                if natural:
                    e2e = cohorts.d.e2e_ms
                    served = pooled_rows[~np.isnan(e2e[pooled_rows])]
                    pooled["output_strata"] = lengths.strata(
                        np.nan_to_num(table.output_tokens[served]).astype(np.int64), e2e[served]
                    )
                aggregates.append(
                    {
                        "cell": cell,
                        "mixture": mix,
                        "rate": rate,
                        "class": name,
                        "repeats": [x["repeat"] for x in reps],
                        "pooled": pooled,
                        "variation": _variation([x["classes"][name] for x in reps]),
                    }
                )
    return aggregates


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
    plan: _Plan,
    run_results: Sequence[RunResult],
    points: _SweepPoints,
    aggregates: Sequence[Aggregate],
    opts: ReportOptions,
    quality_probes: Sequence[QualityProbeInput],
    validator_budget: ValidatorBudget | None,
) -> _Uncompared:
    """Validity, and acceptance pooled over the repeats with each class's quality contract."""
    cells, baseline = plan.cells, plan.baseline
    validity = validity_check(
        experiment=experiment, cells=cells, baseline=baseline, run_results=run_results, combos=points.combos
    )
    skipped = {
        (r["cell"], r["mixture"], r["rate"], r["repeat"]): r["reason"]
        for r in points.runs
        if r["status"] == "skipped" and r["reason"]
    }
    acceptance = acceptance_check(
        cells=cells,
        classes=classes,
        aggregates=aggregates,
        agreed=points.agreed,
        alpha=opts.compare.contract_alpha,
        skipped=skipped,
    )
    # Check 2 also holds each class to its quality contract (apps/analysis/quality.py).
    probe_result = quality.quality_check(
        cells=cells, classes=classes, baseline=baseline, probes=quality_probes, budget=validator_budget
    )
    quality.apply_to_acceptance(acceptance, probe_result, baseline=baseline)
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
    plan: _Plan,
    points: _SweepPoints,
    cohorts: _Cohorts,
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


def _records_summary(table: RecordTable, cohorts: _Cohorts, plan: _Plan) -> RecordsSummary:
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
) -> Report:
    """Per-run metrics, pooled aggregates, paired comparisons, checks, findings and the decision.

    1. Derive every record's outcome and latencies from its planned arrival.
    2. Per run and class: counts, censored percentiles, goodput, contract verdict.
    3. Per (cell, mixture, rate, class): repeats pooled, with their variation.
    4. Validity, and acceptance pooled over the repeats (exact binomial tests).
    5. Per candidate, (mixture, rate) and class: paired block bootstrap against B0,
       the gain family (Holm), the decision, and the same under a second seed (paired.py).
    6. The other checks, the findings; chart-ready aggregates.
    """
    opts = options if isinstance(options, ReportOptions) else ReportOptions.from_mapping(options)
    plan = _plan(cells, classes)
    windows = {str(r["key"]): metrics.run_window(r) for r in runs}
    natural = experiment.get("output_mode") == "natural"
    cohorts = _cohorts(
        table, windows, plan, natural=natural, token_hists=token_hists, chunk_hists=chunk_hists
    )
    run_results = [
        _run_result(r, windows[str(r["key"])], cohorts, plan, (samples or {}).get(str(r["key"]), []))
        for r in runs
    ]
    run_by_key = {r["key"]: r for r in run_results}
    points = _sweep_points(run_results, experiment, opts)
    aggregates = _aggregates(plan, points, cohorts, run_by_key, table, natural=natural)
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
    )
    # 6. The other checks, the findings, the report.
    checks: Checks = {
        "validity": before.validity,
        "acceptance": before.acceptance,
        "quality": before.quality,
        "failure_scenarios": scenario_check(run_results, scenario_verdicts),
        "recovery": _recovery(decision, plan.baseline, rollback, rehearse=rehearse, rehearsals=rehearsals),
    }
    found = findings.findings(
        cells=plan.cells,
        classes=classes,
        baseline=plan.baseline,
        run_results=run_results,
        aggregates=aggregates,
        comparisons=comparisons,
        stall_ratio=opts.stall_ratio,
        invalid_cells=before.validity["invalid_cells"],
    )
    report: Report = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "experiment": _identity(experiment),
        "options": opts.to_json(),
        "baseline": plan.baseline,
        "cells": [
            {"cell_id": c["cell_id"], "role": c.get("role"), "args": c.get("args") or {}} for c in plan.cells
        ],
        "classes": [dict(c) for c in classes],
        "records": _records_summary(table, cohorts, plan),
        "runs": run_results,
        "skipped": skipped_cells(run_results),
        "aggregates": aggregates,
        "comparisons": comparisons,
        "checks": checks,
        "findings": found,
        "statistics": statistics,
        "decision": decision,
        "output_mode": "natural" if natural else "exact",
        "stop_reasons": lengths.stop_reasons_by_cell(run_results, stop_reasons or {}),
        "costs": _costs(experiment, opts, cells=plan.cells, run_results=run_results, agreed=points.agreed),
        # Each rehearsed cell's attempts, the latest one's measures in full (apps/analysis/rehearsal.py).
        "rehearsals": dict(rehearsals or {}),
        "charts": charts(
            cell_ids=plan.cell_ids, aggregates=aggregates, comparisons=comparisons, run_results=run_results
        ),
    }
    return jsonable(report)


def skipped_cells(run_results: Sequence[RunResult]) -> list[SkippedCell]:
    """The cells early stopping cut short, in the runs' order: cell, the reason, the skipped runs."""
    out: dict[str, SkippedCell] = {}
    for r in run_results:
        if r["status"] == "skipped" and not r["scenario"]:
            entry = out.setdefault(
                r["cell"], {"cell": r["cell"], "reason": r.get("reason") or "", "runs": []}
            )
            entry["runs"].append(r["key"])
    return list(out.values())


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
                **{h: [] for h in HEADLINE},
                "censored": {h: [] for h in HEADLINE},
            },
        )
        g["cells"].append(a["cell"])
        head = _headline(a["pooled"])
        for h in HEADLINE:
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
