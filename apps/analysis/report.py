"""The whole experiment report, from plain inputs. Pure: the database service and tests both call it.

Inputs (dicts, as the service builds them from the models):

- experiment: id, name, model_revision, tokenizer_revision, hardware_id
  (optional), generation, max_dispatch_lag_ms, mixtures, rates (optional).
- cells: cell_id, role ("baseline" | "candidate"), args, position.
- classes: name, input_tokens, and the contract (ttft_p99_ms, e2e_p99_ms,
  max_stall_ms, error_rate).
- runs: key (the run id the records carry), cell, mixture, rate, rate_rps,
  repeat, scenario, status, trace_sha256, corpus_sha256, hardware_id,
  model_revision, tokenizer_revision, dispatch_lag_p99_ms, warmup_s,
  observation_s, drain_deadline_s (and optionally generation).
- table: a RecordTable of every run's records.
- samples: run key -> MetricSample dicts (optional).
- token_hists / chunk_hists: (run key, class) -> merged cohort GapHistogram,
  when the caller merged them already (else they come from the table).
- rollback: {"exists": bool, "baseline": str | None}.
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
from typing import Any

import numpy as np

from apps.analysis import cost, findings, lengths, metrics, paired, quality, rejections
from apps.analysis.checks import acceptance_check, recovery_check, scenario_check, validity_check
from apps.analysis.columns import RecordTable
from apps.analysis.report_options import ReportOptions, agreed_combos, sweep_combos
from apps.analysis.report_types import (
    Aggregate,
    Checks,
    DiffPoint,
    RehearsalEntry,
    Report,
    ReportCharts,
    RunResult,
    SkippedCell,
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


def _headline(m: Mapping[str, Any]) -> dict[str, float]:
    return {
        "goodput_rps": m["goodput_rps"] if m["goodput_rps"] is not None else math.nan,
        "contract_share": m["contract_share"] if m["contract_share"] is not None else math.nan,
        "ttft_p99": metrics.pvalue(m["ttft_ms"]["p99"]),
        "e2e_p99": metrics.pvalue(m["e2e_ms"]["p99"]),
        "max_stall_p99": metrics.pvalue(m["max_stall_ms"]["p99"]),
        "itl_p99": m["itl_ms"]["p99"] if m["itl_ms"]["p99"] is not None else math.inf,
    }


def _variation(per_repeat: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
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


def build_report(
    *,
    experiment: Mapping[str, Any],
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any]],
    table: RecordTable,
    samples: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    token_hists: Mapping[tuple[str, str], GapHistogram] | None = None,
    chunk_hists: Mapping[tuple[str, str], GapHistogram] | None = None,
    rollback: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | ReportOptions | None = None,
    scenario_verdicts: Mapping[str, Mapping[str, Any]] | None = None,
    rehearsals: Mapping[str, RehearsalEntry] | None = None,
    rehearse: bool = True,
    stop_reasons: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None,
    quality_probes: Sequence[Mapping[str, Any]] | None = None,
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
    cells = sorted(cells, key=lambda c: (int(c.get("position", 0)), str(c["cell_id"])))
    cell_ids = [c["cell_id"] for c in cells]
    if len(set(cell_ids)) != len(cell_ids):
        raise ValueError("cell ids must be unique")
    baselines = [c["cell_id"] for c in cells if c.get("role") == "baseline"]
    if len(baselines) != 1:
        raise ValueError(f"expected exactly one baseline cell, got {len(baselines)}")
    baseline = baselines[0]
    contracts = {c["name"]: metrics.Contract.from_mapping(c) for c in classes}
    class_names = [c["name"] for c in classes]
    windows = {str(r["key"]): metrics.run_window(r) for r in runs}

    # 1. Derive, then group cohort rows by (run, class) with one sort.
    natural = experiment.get("output_mode") == "natural"
    d = metrics.derive(table, windows, contracts, natural=natural)
    groups = metrics.cohort_groups(d)
    unknown_classes = sorted({c for (_, c) in groups} - set(class_names))
    if token_hists is None:
        token_hists = metrics.cohort_histograms(d, which="token_gaps")
    if chunk_hists is None:
        chunk_hists = metrics.cohort_histograms(d, which="chunk_gaps")
    empty = np.zeros(0, dtype=np.int64)

    # 2. Per run, per class.
    run_results: list[RunResult] = []
    for r in runs:
        key = str(r["key"])
        w = windows[key]
        per_class = {
            name: metrics.class_metrics(
                d,
                groups.get((key, name), empty),
                contract=contracts[name],
                observation_s=w.observation_s,
                token_hist=token_hists.get((key, name)),
                chunk_hist=chunk_hists.get((key, name)),
            )
            for name in class_names
        }
        all_rows = np.concatenate([groups.get((key, n), empty) for n in class_names])
        total_tokens = sum(m["output_tokens"] for m in per_class.values())
        run_results.append(
            {
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
                "lateness_ms": metrics.plain_stats(d.lateness_ms[all_rows]),
                # Absent, never 0, for a run that produced no records in its window.
                "tokens_per_s": round(total_tokens / w.observation_s, 6)
                if all_rows.size and w.observation_s > 0
                else None,
                "classes": per_class,
                "server": server_metrics((samples or {}).get(key, [])),
            }
        )
    run_by_key = {r["key"]: r for r in run_results}

    # The sweep's (mixture, rate, repeat) combinations, and those judged.
    sweep = [r for r in run_results if not r["scenario"]]
    combos = sweep_combos(sweep, experiment)
    repeats = sorted({r["repeat"] for r in sweep})
    agreed = agreed_combos(combos, opts)
    done: dict[tuple[str, str, str, int], RunResult] = {}
    for r in sweep:
        if r["status"] == "done":
            done.setdefault((r["cell"], r["mixture"], r["rate"], r["repeat"]), r)

    # 3. Pooled across repeats.
    aggregates: list[Aggregate] = []
    for cell in cell_ids:
        for mix, rate in sorted({(c[0], c[1]) for c in combos}):
            reps = [done[(cell, mix, rate, rep)] for rep in repeats if (cell, mix, rate, rep) in done]
            if not reps:
                continue
            obs = sum(run_by_key[x["key"]]["window"]["observation_s"] for x in reps)
            for name in class_names:
                pooled_rows = np.concatenate([groups.get((x["key"], name), empty) for x in reps])
                pooled = metrics.class_metrics(
                    d,
                    pooled_rows,
                    contract=contracts[name],
                    observation_s=obs,
                    token_hist=_merge([token_hists.get((x["key"], name)) for x in reps]),
                    chunk_hist=_merge([chunk_hists.get((x["key"], name)) for x in reps]),
                )
                if natural:
                    served = pooled_rows[~np.isnan(d.e2e_ms[pooled_rows])]
                    pooled["output_strata"] = lengths.strata(
                        np.nan_to_num(table.output_tokens[served]).astype(np.int64), d.e2e_ms[served]
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

    # 4. The checks that need no comparison: validity, and acceptance pooled over repeats.
    validity = validity_check(
        experiment=experiment, cells=cells, baseline=baseline, run_results=run_results, combos=combos
    )
    skipped = {
        (r["cell"], r["mixture"], r["rate"], r["repeat"]): r["reason"]
        for r in sweep
        if r["status"] == "skipped" and r["reason"]
    }
    acceptance = acceptance_check(
        cells=cells,
        classes=classes,
        aggregates=aggregates,
        agreed=agreed,
        alpha=opts.compare.contract_alpha,
        skipped=skipped,
    )
    # Check 2 also holds each class to its quality contract (apps/analysis/quality.py).
    probe_result = quality.quality_check(
        cells=cells,
        classes=classes,
        baseline=baseline,
        probes=quality_probes or [],
        budget=validator_budget,
    )
    quality.apply_to_acceptance(acceptance, probe_result, baseline=baseline)
    # The decision table's rejecting rows, which the decision reads.
    rejected = rejections.rejections(
        cells=cells,
        classes=classes,
        baseline=baseline,
        aggregates=aggregates,
        run_results=run_results,
        agreed=agreed,
        max_preemption_share=opts.max_preemption_share,
    )
    # 5-6. The paired comparison, the gain family, the decision and the seed check.
    comparisons, decision, statistics = paired.judge_sweep(
        paired.Sweep(
            d=d,
            table=table,
            groups=groups,
            done=done,
            run_by_key=run_by_key,
            token_hists=token_hists,
            cell_ids=cell_ids,
            baseline=baseline,
            class_names=class_names,
            combos=combos,
            repeats=repeats,
        ),
        cells=cells,
        classes=classes,
        validity=validity,
        acceptance=acceptance,
        agreed=agreed,
        options=opts.compare,
        rejected=rejected,
    )

    # 6. The other checks, findings.
    checks: Checks = {
        "validity": validity,
        "acceptance": acceptance,
        "quality": probe_result,
        "failure_scenarios": scenario_check(run_results, scenario_verdicts),
        "recovery": recovery_check(
            rollback,
            chosen_cell=decision.get("chosen_cell"),
            baseline=baseline,
            rehearse=rehearse,
            rehearsal=(rehearsals or {}).get(str(decision.get("chosen_cell"))),
        ),
    }
    found = findings.findings(
        cells=cells,
        classes=classes,
        baseline=baseline,
        run_results=run_results,
        aggregates=aggregates,
        comparisons=comparisons,
        stall_ratio=opts.stall_ratio,
        invalid_cells=validity["invalid_cells"],
    )

    report: Report = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "experiment": {
            "id": experiment.get("id"),
            "name": experiment.get("name"),
            "model_revision": experiment.get("model_revision"),
            "tokenizer_revision": experiment.get("tokenizer_revision"),
        },
        "options": opts.to_json(),
        "baseline": baseline,
        "cells": [
            {"cell_id": c["cell_id"], "role": c.get("role"), "args": c.get("args") or {}} for c in cells
        ],
        "classes": [dict(c) for c in classes],
        "records": {
            "total": len(table),
            "cohort": int(np.count_nonzero(d.cohort)),
            "unknown_classes": unknown_classes,
        },
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
        "costs": _costs(experiment, opts, cells=cells, run_results=run_results, agreed=agreed),
        # Each rehearsed cell's attempts, the latest one's measures in full (apps/analysis/rehearsal.py).
        "rehearsals": dict(rehearsals or {}),
        "charts": charts(
            cell_ids=cell_ids, aggregates=aggregates, comparisons=comparisons, run_results=run_results
        ),
    }
    return jsonable(report)


def skipped_cells(run_results: Sequence[Mapping[str, Any]]) -> list[SkippedCell]:
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
    experiment: Mapping[str, Any],
    opts: ReportOptions,
    *,
    cells: Sequence[Mapping[str, Any]],
    run_results: Sequence[Mapping[str, Any]],
    agreed: Sequence[tuple[str, str, int]],
) -> dict[str, Any]:
    """Cost per 1M output tokens per cell: the spec's price, else the host's, else none."""
    price, source = opts.usd_per_gpu_hour, "spec (analysis.usd_per_gpu_hour)"
    if price is None and experiment.get("host_usd_per_gpu_hour") is not None:
        price = float(experiment["host_usd_per_gpu_hour"])
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
    aggregates: Sequence[Mapping[str, Any]],
    comparisons: Sequence[Mapping[str, Any]],
    run_results: Sequence[Mapping[str, Any]],
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
