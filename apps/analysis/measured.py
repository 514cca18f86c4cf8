"""Steps 1-3 of the report (apps/analysis/report.py): what each run and each pooled point
measured. Pure.

1. Every record derived once from its planned arrival (metrics.derive), the cohort rows of each
   (run, class) and their merged gap histograms (``derive_cohorts``).
2. Each run's identity, window and metrics per class (``run_result``).
3. Each (cell, mixture, rate, class) pooled over its done repeats, with the repeats' variation
   (``pooled``), at the sweep's points (``sweep_points``).

``Plan`` is the cells in plan order, B0 and each class's contract; ``headline`` the few numbers
of a class's metrics the variation and the charts show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.analysis import lengths, metrics
from apps.analysis.columns import RecordTable
from apps.analysis.report_inputs import CellInput, ClassInput, ExperimentInput, MetricSampleInput, RunInput
from apps.analysis.report_options import ReportOptions, agreed_combos, sweep_combos
from apps.analysis.report_types import Aggregate, ClassMetrics, RunResult
from apps.analysis.server_metrics import server_metrics
from workers.replay.records import GapHistogram

HEADLINE = ("goodput_rps", "contract_share", "ttft_p99", "e2e_p99", "max_stall_p99", "itl_p99")


def _merge(hists: Sequence[GapHistogram | None]) -> GapHistogram | None:
    present = [h for h in hists if h is not None]
    if not present:
        return None
    out = GapHistogram()
    for h in present:
        out.merge(h)
    return out


def headline(m: ClassMetrics) -> dict[str, float]:
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
        vals = [headline(m)[name] for m in per_repeat]
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
class Plan:
    """The cells in plan order, B0 among them, and each class's contract."""

    cells: list[CellInput]
    cell_ids: list[str]
    baseline: str
    class_names: list[str]
    contracts: dict[str, metrics.Contract]


def plan_of(cells: Sequence[CellInput], classes: Sequence[ClassInput]) -> Plan:
    """Cells sorted by plan position (then id); exactly one baseline; every class's contract."""
    ordered = sorted(cells, key=lambda c: (int(c.get("position", 0)), str(c["cell_id"])))
    cell_ids = [c["cell_id"] for c in ordered]
    if len(set(cell_ids)) != len(cell_ids):
        raise ValueError("cell ids must be unique")
    baselines = [c["cell_id"] for c in ordered if c.get("role") == "baseline"]
    if len(baselines) != 1:
        raise ValueError(f"expected exactly one baseline cell, got {len(baselines)}")
    contracts = {c["name"]: metrics.Contract.from_mapping(c) for c in classes}
    return Plan(
        cells=ordered,
        cell_ids=cell_ids,
        baseline=baselines[0],
        class_names=[c["name"] for c in classes],
        contracts=contracts,
    )


@dataclass(frozen=True)
class Cohorts:
    """Every record derived once, the cohort rows of each (run key, class), and their merged
    gap histograms (the caller's, when it merged them already)."""

    d: metrics.Derived
    groups: dict[tuple[str, str], np.ndarray]
    token_hists: Mapping[tuple[str, str], GapHistogram]
    chunk_hists: Mapping[tuple[str, str], GapHistogram]
    empty: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def rows(self, key: str, name: str) -> np.ndarray:
        return self.groups.get((key, name), self.empty)


def derive_cohorts(
    table: RecordTable,
    windows: Mapping[str, metrics.Window],
    plan: Plan,
    *,
    natural: bool,
    token_hists: Mapping[tuple[str, str], GapHistogram] | None,
    chunk_hists: Mapping[tuple[str, str], GapHistogram] | None,
) -> Cohorts:
    """Step 1: derive every record's outcome and latencies, then group the cohort rows by
    (run, class) with one sort."""
    d = metrics.derive(table, windows, plan.contracts, natural=natural)
    groups = metrics.cohort_groups(d)
    if token_hists is None:
        token_hists = metrics.cohort_histograms(d, which="token_gaps")
    if chunk_hists is None:
        chunk_hists = metrics.cohort_histograms(d, which="chunk_gaps")
    return Cohorts(d=d, groups=groups, token_hists=token_hists, chunk_hists=chunk_hists)


def run_result(
    r: RunInput,
    w: metrics.Window,
    cohorts: Cohorts,
    plan: Plan,
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
    warmup_s, drain_s = float(r["warmup_s"]), float(r["drain_deadline_s"])
    return {
        "key": key,
        "run_id": key,
        # The method's names (apps/runs/record_names.py); ``cell`` and ``window`` below are their
        # older aliases, which the report's own readers use.
        "cell_id": r["cell"],
        "cell": r["cell"],
        "mixture": r["mixture"],
        "rate": r["rate"],
        "rate_rps": r.get("rate_rps"),
        "repeat": int(r["repeat"]),
        "position": r.get("position"),
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
        "warmup_seconds": warmup_s,
        "observation_seconds": w.observation_s,
        "drain_deadline_seconds": drain_s,
        "window": {"warmup_s": warmup_s, "observation_s": w.observation_s, "drain_deadline_s": drain_s},
        "lateness_ms": metrics.plain_stats(cohorts.d.lateness_ms[all_rows]),
        # Absent, never 0, for a run that produced no records in its window.
        "tokens_per_s": round(total_tokens / w.observation_s, 6)
        if all_rows.size and w.observation_s > 0
        else None,
        "classes": per_class,
        "server": server_metrics(samples),
    }


@dataclass(frozen=True)
class SweepPoints:
    """The sweep's runs (failure scenarios apart), its (mixture, rate, repeat) points, those
    judged (``agreed``), and the first done run of each (cell, mixture, rate, repeat)."""

    runs: list[RunResult]
    combos: list[tuple[str, str, int]]
    repeats: list[int]
    agreed: list[tuple[str, str, int]]
    done: dict[tuple[str, str, str, int], RunResult]


def sweep_points(
    run_results: Sequence[RunResult], experiment: ExperimentInput, opts: ReportOptions
) -> SweepPoints:
    sweep = [r for r in run_results if not r["scenario"]]
    combos = sweep_combos(sweep, experiment)
    done: dict[tuple[str, str, str, int], RunResult] = {}
    for r in sweep:
        if r["status"] == "done":
            done.setdefault((r["cell"], r["mixture"], r["rate"], r["repeat"]), r)
    return SweepPoints(
        runs=sweep,
        combos=combos,
        repeats=sorted({r["repeat"] for r in sweep}),
        agreed=agreed_combos(combos, opts),
        done=done,
    )


def pooled(
    plan: Plan,
    points: SweepPoints,
    cohorts: Cohorts,
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
