"""Analyse an experiment from its rows and store the decision.

The statistics live in the pure modules (apps/analysis/report.py and below);
this module only turns rows into their plain inputs, efficiently:

- records come as columns (apps/analysis/record_reader.py: a packed binary COPY
  on Postgres, one numpy array per field), never as model instances;
- the per-request gap histograms are merged per (run, class) cohort inside
  the database (json_each / jsonb_each), so a million JSON objects never
  cross into Python;
- only runs with status ``done`` count as data: any other run leaves its cell
  incomplete, which the validity check reports.

Over 500 lines on purpose: this is the analysis's one reader of the database (the report's rows
and typed inputs, the records as columns, the histograms merged in SQL, the samples, the
rollback rehearsals' attempts), each query tuned beside the others; the statistics stay pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.db import transaction

from apps.analysis.early_stop import run_over_limits
from apps.analysis.models import Decision
from apps.analysis.pool_capacity import class_capacities
from apps.analysis.record_reader import load_table as _load_table
from apps.analysis.rehearsal_measures import (
    REHEARSAL_QUEUED,
    RehearsalRecord,
    attempt_outcome,
    attempts_summary,
    rehearsal_measures,
)
from apps.analysis.report import build_report
from apps.analysis.report_inputs import (
    CellInput,
    ClassCapacity,
    ClassInput,
    ExperimentInput,
    ExperimentInputs,
    HostPrice,
    MetricSampleInput,
    QualityProbeInput,
    RollbackInput,
    SampleValue,
    StoredRun,
    report_run,
)
from apps.analysis.report_types import RecoveryCheck, RehearsalEntry, Report, StoredReport
from apps.analysis.run_digest import report_records as _report_records
from apps.analysis.server_metrics import COUNTERS, GAUGES, HISTOGRAMS
from apps.analysis.validators import ValidatorBudget
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.experiments.recovery import recovery_options
from apps.runs.engine_time import engine_time_summary
from apps.runs.models import Host, MetricSample, Run
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.summary_types import rehearsal_facts, run_summary
from workers.replay.records import SCALAR_RECORD_FIELDS

_CHUNK = 50_000


def _experiment_inputs(experiment: Experiment) -> ExperimentInputs:
    workload = getattr(experiment, "workload", None)
    spec_quality = {c["name"]: c.get("quality") for c in (experiment.spec or {}).get("classes") or []}
    cells: list[CellInput] = []
    for c in experiment.cells.all():
        cell: CellInput = {
            "cell_id": c.cell_id,
            "role": c.role,
            "args": c.args,
            "position": c.position,
            "engine": c.engine,
        }
        if c.control:
            cell["control"] = True  # an A/A cell (B0 run again): the measured noise floor
        cells.append(cell)
    classes: list[ClassInput] = [
        {**c, "quality": spec_quality.get(c["name"]) or {}} for c in _class_inputs(experiment)
    ]
    info: ExperimentInput = {
        "id": experiment.pk,
        "name": experiment.name,
        "model_revision": experiment.model_revision,
        "tokenizer_revision": experiment.tokenizer_revision,
        "generation": experiment.generation,
        "tensor_parallel_size": experiment.tensor_parallel_size,
        "output_mode": workload.output_mode if workload else "exact",
        **_host_price(experiment),
        "max_dispatch_lag_ms": workload.max_dispatch_lag_ms if workload else None,
        "mixtures": workload.mixtures if workload else {},
        "rates": workload.rates if workload else {},
        "enable_prefix_caching": bool(experiment.enable_prefix_caching),
        "search": "search" in (experiment.spec or {}),
        # Where the rates came from, and B0's capacity per mixture where the probe measured it:
        # what an overloaded B0's offered load is held against (apps/analysis/overload.py).
        "rates_source": workload.rates_source if workload else "manual",
        "capacities": {
            str(m): float(c)
            for m, c in ((workload.rates_derivation or {}).get("capacities") or {}).items()
            if c is not None
        }
        if workload
        else {},
    }
    return {"experiment": info, "cells": cells, "classes": classes}


def _class_inputs(experiment: Experiment) -> list[ClassInput]:
    return [
        {
            "name": c.name,
            "input_tokens": c.input_tokens,
            "output_tokens": c.output_tokens,
            "ttft_p99_ms": c.ttft_p99_ms,
            "e2e_p99_ms": c.e2e_p99_ms,
            "max_stall_ms": c.max_stall_ms,
            "error_rate": c.error_rate,
            "primary_metric": c.primary_metric or None,
        }
        for c in experiment.classes.all()
    ]


def _host_price(experiment: Experiment) -> HostPrice:
    """The price per GPU-hour of the host that served B0's sweep runs, when it gave one."""
    host = (
        Host.objects.filter(
            runs__experiment=experiment, runs__cell__role="baseline", usd_per_gpu_hour__isnull=False
        )
        .order_by("name")
        .first()
    )
    return {"host_usd_per_gpu_hour": host.usd_per_gpu_hour, "host_name": host.name} if host else {}


def _run_inputs(runs: list[Run]) -> list[StoredRun]:
    return [
        {
            "key": str(r.run_id),
            "pk": r.pk,
            "cell": r.cell.cell_id,
            "mixture": r.mixture,
            "rate": r.rate_name,
            "rate_rps": r.rate_rps,
            "repeat": r.repeat,
            "position": r.round_position,
            "scenario": r.scenario_label,
            "status": r.status,
            "reason": r.reason[:2000],
            "trace_sha256": r.trace_sha256,
            "corpus_sha256": r.corpus_sha256,
            "hardware_id": r.hardware_id,
            "model_revision": r.model_revision,
            "tokenizer_revision": r.tokenizer_revision,
            "image_digest": r.image_digest,
            "vllm_version": r.vllm_version,
            "effective_args": r.effective_args,
            "generation": r.generation,
            "dispatch_lag_p99_ms": r.dispatch_lag_p99_ms,
            "warmup_s": r.warmup_seconds,
            "observation_s": r.observation_seconds,
            "drain_deadline_s": r.drain_deadline_seconds,
            # Whether vLLM's spans joined enough of the run's records (apps/analysis/ttft_parts.py).
            "server_spans": (r.summary or {}).get("server_spans") if isinstance(r.summary, dict) else None,
        }
        for r in runs
    ]


def _samples(run_inputs: Sequence[StoredRun]) -> dict[str, list[MetricSampleInput]]:
    names = {n for group in (COUNTERS, GAUGES) for ns in group.values() for n in ns}
    names |= {f"{n}_total" for n in names}
    names |= {n for ns in HISTOGRAMS.values() for n in ns}
    by_pk = {r["pk"]: r["key"] for r in run_inputs}
    out: dict[str, list[MetricSampleInput]] = defaultdict(list)
    qs = (
        MetricSample.objects.filter(run_id__in=list(by_pk), name__in=sorted(names))
        .order_by()
        .values_list("run_id", "t_ns", "phase", "epoch", "name", "labels", "kind", "value", "histogram")
    )
    for run_id, t_ns, phase, epoch, name, labels, kind, value, histogram in qs.iterator(chunk_size=_CHUNK):
        out[by_pk[run_id]].append(
            {
                "t_ns": t_ns,
                "phase": phase,
                "epoch": epoch,
                "name": name,
                "labels": labels,
                "kind": kind,
                "value": value,
                "histogram": histogram,
            }
        )
    return out


def _rollback(experiment: Experiment) -> RollbackInput:
    # The reverse one-to-one raises an AttributeError subclass when absent.
    manifest = getattr(experiment, "manifest", None)
    if manifest is None:
        return {"exists": False, "baseline": None}
    baseline = (manifest.content or {}).get("baseline")
    if isinstance(baseline, dict):
        baseline = baseline.get("id") or baseline.get("cell_id") or (baseline and "baseline")
    return {"exists": True, "baseline": str(baseline) if baseline else None}


def recovery_check_now(*, experiment: Experiment, report: StoredReport) -> RecoveryCheck:
    """Check 4 as stored, with the manifest's part from now: the manifest is written at approval,
    after the last analysis (a finished rehearsal analyses again, so the rest is current).
    For display; the stored report stays what the approver saw."""
    stored = dict((report.get("checks") or {}).get("recovery") or {})
    rollback = _rollback(experiment)
    stored["manifest"] = bool(rollback["exists"])
    if rollback["baseline"]:
        stored["baseline"] = rollback["baseline"]
    return cast(RecoveryCheck, stored)  # as the stored report's check 4 has it


def validator_budget() -> ValidatorBudget:
    """The host's time budget for a class's validators (TAILTUNE_VALIDATOR_ANSWER_MS, _EXPERIMENT_S)."""
    return ValidatorBudget(
        answer_s=settings.TAILTUNE_VALIDATOR_ANSWER_MS / 1000,
        experiment_s=float(settings.TAILTUNE_VALIDATOR_EXPERIMENT_S),
    )


@dataclass(frozen=True)
class ReportRows:
    """An experiment's rows as its report reads them (report_rows)."""

    experiment: Experiment  # with its workload
    inputs: ExperimentInputs  # build_report's experiment, cells and classes
    runs: list[Run]  # every run but the rollback rehearsals, in plan order
    run_inputs: list[StoredRun]  # the same runs as the report's inputs, with their primary keys

    @property
    def done(self) -> list[StoredRun]:
        """The runs that count as data (any other leaves its cell incomplete)."""
        return [r for r in self.run_inputs if r["status"] == Run.Status.DONE]


def report_rows(*, experiment_id: int) -> ReportRows:
    """The experiment, its report's inputs and its runs: every run but the rollback rehearsals
    (rehearsal_inputs reads those) and a search's screening runs (one round at one point, on
    cells that are no candidate until confirmed: the report's ``search`` carries them, and only
    the confirmation rounds feed the verdict), in plan order. The Run rows come too: the quality
    probes (_quality_probes) read their summaries. For experiment_report_build and the
    recorded-set export (bench/analysis/record_aa.py)."""
    experiment = Experiment.objects.select_related("workload").get(pk=experiment_id)
    inputs = _experiment_inputs(experiment)
    runs = list(
        experiment.runs.exclude(kind__in=[Run.Kind.REHEARSAL, Run.Kind.SCREEN])
        .select_related("cell")
        .order_by("plan_position", "id")
    )
    return ReportRows(experiment=experiment, inputs=inputs, runs=runs, run_inputs=_run_inputs(runs))


def _quality_probes(runs: Sequence[Run]) -> list[QualityProbeInput]:
    """The quality probe's answers of each done sweep run that ran it, in the runs' order."""
    return [
        {"run": str(r.run_id), "cell": r.cell.cell_id, **run_summary(r.summary)["quality_probe"]}
        for r in runs
        if r.status == Run.Status.DONE
        and r.kind == Run.Kind.SWEEP
        and run_summary(r.summary).get("quality_probe")
    ]


def experiment_report_build(
    *, experiment_id: int, options: dict[str, Any] | None = None, search: dict[str, Any] | None = None
) -> Report:
    """The full report of an experiment (see apps/analysis/report.py), computed from its rows now.

    ``search``: a search experiment's trials as apps/search/selectors.search_report gives them
    (the layer above reads them; callers in apps/lifecycle and the experiment_report command
    pass it), carried as the report's ``search``."""
    rows = report_rows(experiment_id=experiment_id)
    experiment = rows.experiment
    done = rows.done
    records = _report_records(done)
    if options is None:
        options = (experiment.spec or {}).get("analysis")
    report = build_report(
        **rows.inputs,
        runs=[report_run(r) for r in rows.run_inputs],
        table=records.table,
        samples=_samples(done),
        token_hists=records.token_hists,
        chunk_hists=records.chunk_hists,
        rollback=_rollback(experiment),
        options=options,
        scenario_verdicts=_scenario_verdicts(experiment_id),
        rehearsals=rehearsal_inputs(experiment=experiment),
        rehearse=bool(recovery_options(experiment.spec or {})["rehearse"]),
        stop_reasons=records.stop_reasons,
        quality_probes=_quality_probes(rows.runs),
        validator_budget=validator_budget(),
        class_capacities=_class_capacities(rows),
    )
    # What the experiment's servers cost, by part, and what reuse and early stopping saved.
    report["engine_time"] = engine_time_summary(experiment=experiment)
    if search is not None:
        report["search"] = search
    return report


def _class_capacities(rows: ReportRows) -> dict[str, dict[str, ClassCapacity]]:
    """Each cell's measured capacity per class alone, from the workload's capacity searches
    (apps/lifecycle/calibration.py), for an isolate decision's pools."""
    workload = getattr(rows.experiment, "workload", None)
    if workload is None:
        return {}
    baseline = next((c["cell_id"] for c in rows.inputs["cells"] if c.get("role") == "baseline"), "")
    return class_capacities(
        workload.rates_derivation or {}, mixtures=workload.mixtures or {}, baseline=baseline
    )


def runs_over_limit(*, experiment: Experiment, runs: list[Run]) -> dict[str, dict[str, dict[str, list[int]]]]:
    """run key -> class -> ``over_limit`` [over, judged] per contract key of each given run, from its
    records by the report's own path (early_stop.run_over_limits): the counts acceptance pools.

    For early stopping (apps/lifecycle/run_skipping.py), which pools one cell's done runs after each run.
    """
    run_inputs = _run_inputs(runs)
    workload = getattr(experiment, "workload", None)
    return run_over_limits(
        runs=run_inputs,
        classes=_class_inputs(experiment),
        table=_load_table(run_inputs),
        natural=bool(workload and workload.output_mode == "natural"),
    )


def screening_measures(*, experiment: Experiment, run: Run) -> dict[str, Any]:
    """A search's screening run as the search scores it (apps/analysis/screening.py): each
    class's p99s and the run's throughput, from its records by the report's path, with the
    experiment's classes (contracts and primary metrics) they are scored against."""
    from apps.analysis.screening import run_screening_measures

    run_inputs = _run_inputs([run])
    workload = getattr(experiment, "workload", None)
    classes = _class_inputs(experiment)
    measures = run_screening_measures(
        runs=run_inputs,
        classes=classes,
        table=_load_table(run_inputs),
        natural=bool(workload and workload.output_mode == "natural"),
    )[str(run.run_id)]
    return {**measures, "classes": classes}


def _scenario_verdicts(experiment_id: int) -> dict[str, Any]:
    """What each failure-scenario run had to show and hold (apps/runs/scenario_reports.py), by run key."""
    from apps.runs.scenario_reports import scenario_reports

    return {
        e["run"]: e["verdict"]
        for e in scenario_reports(experiment_id=experiment_id)["runs"]
        if e.get("verdict")
    }


class DecisionFrozen(ValueError):
    """The experiment has a verdict: the decision behind it is evidence and never changes."""


@transaction.atomic
def experiment_analyse(*, experiment_id: int, search: dict[str, Any] | None = None) -> Decision:
    """Build the report and store its decision (one row per experiment, replaced on re-analysis).

    Refused (DecisionFrozen) once the experiment is approved or rejected: the decision an
    approver saw is evidence, and the manifest names its digest.
    """
    # Under the row lock an approval takes too: no verdict lands between this check and the write.
    status = (
        Experiment.objects.select_for_update()
        .filter(pk=experiment_id)
        .values_list("status", flat=True)
        .first()
    )
    if status in Experiment.DECIDED:
        raise DecisionFrozen(
            f"experiment {experiment_id} is {status}: its decision is the evidence behind that verdict "
            "and is never recomputed (experiment_report without --save still reports)"
        )
    report = experiment_report_build(experiment_id=experiment_id, search=search)
    decision = report["decision"]
    row, _ = Decision.objects.update_or_create(
        experiment_id=experiment_id,
        defaults={
            "outcome": decision["outcome"],
            "chosen_cell": decision["chosen_cell"] or "",
            "rule": decision["rule"],
            "evidence": decision["evidence"],
            "checks": report["checks"],
            "findings": report["findings"],
            "report": report,
        },
    )
    return row


def rehearsal_inputs(*, experiment: Experiment) -> dict[str, RehearsalEntry]:
    """Each rehearsed cell's attempts, for the report, check 4 and the manifest.

    Every rehearsal run of a cell is one attempt, in the order queued, with its outcome
    (rehearsal.attempt_outcome) and, from the audit log, who queued it and why it was rehearsed
    again (apps/lifecycle/rehearsal_schedule.py records both). The latest attempt's full measures stay at
    the top of the entry, for the results page's timeline.
    """
    options = recovery_options(experiment.spec or {})
    classes: list[ClassInput] = [
        {
            "name": c.name,
            "ttft_p99_ms": c.ttft_p99_ms,
            "e2e_p99_ms": c.e2e_p99_ms,
            "max_stall_ms": c.max_stall_ms,
            "error_rate": c.error_rate,
        }
        for c in experiment.classes.order_by("position")
    ]
    runs = list(
        experiment.runs.filter(kind=Run.Kind.REHEARSAL)
        .select_related("cell", "retry", "retry_of")
        .order_by("id")
    )
    queued = {
        e.target: e
        for e in AuditEvent.objects.filter(experiment=experiment, action=REHEARSAL_QUEUED)
        .select_related("actor")
        .order_by("id")
    }
    # A run the service failed under a lost worker or host and queued again: its reason, by the
    # failed run's id (apps/lifecycle/retries.run_requeue_once).
    requeued = {
        e.target: str((e.detail or {}).get("reason") or "")
        for e in AuditEvent.objects.filter(experiment=experiment, action="run.requeued")
    }
    out: dict[str, RehearsalEntry] = {}
    for run in runs:
        measures = (
            _rehearsal_measures(run, classes=classes, options=options)
            if run.status == Run.Status.DONE
            else None
        )
        entry = out.setdefault(
            run.cell.cell_id, {"run": "", "status": "", "reason": "", "measures": None, "attempts": []}
        )
        attempts = entry.setdefault("attempts", [])
        # The latest attempt's run, status, reason and measures sit on top (the timeline's).
        entry["run"], entry["status"], entry["reason"] = str(run.run_id), run.status, run.reason[:2000]
        entry["measures"] = measures
        by_service = _has_retry(run)
        outcome, why = attempt_outcome(
            status=run.status, measures=measures, reason=run.reason[:2000], requeued=by_service
        )
        event = queued.get(str(run.run_id))
        repeat_reason: str | None = None
        if attempts:  # a repeat: the reason its author typed, or the service's own
            if event is not None:
                repeat_reason = str((event.detail or {}).get("reason") or "")
            elif run.retry_of is not None:
                lost = requeued.get(str(run.retry_of.run_id)) or run.retry_of.reason
                repeat_reason = f"queued again by the service: {lost}"
            repeat_reason = repeat_reason or "(no reason recorded)"
        attempts.append(
            {
                "attempt": len(attempts) + 1,
                "run": str(run.run_id),
                "status": run.status,
                "outcome": outcome,
                "why": why[:2000],
                "requeued_by_service": by_service,
                "requested_by": event.actor.get_username() if event is not None and event.actor else None,
                "repeat_reason": repeat_reason,
                "queued_at": run.created_at.isoformat() if run.created_at else None,
                "finished_at": run.finished_at.isoformat() if run.finished_at else None,
                "time_to_recover_s": (measures or {}).get("time_to_recover_s"),
                "max_recovery_s": (measures or {}).get("max_recovery_s"),
                "standby": (measures or {}).get("standby"),
            }
        )
    for entry in out.values():
        entry["summary"] = attempts_summary(entry.get("attempts") or [])
    return out


def _has_retry(run: Run) -> bool:
    try:
        return run.retry is not None
    except Run.DoesNotExist:
        return False


def _rehearsal_measures(run: Run, *, classes: list[ClassInput], options: Any) -> dict[str, Any] | None:
    """What one done rehearsal run measured (apps/analysis/rehearsal_measures.py); None without its facts."""
    facts = rehearsal_facts(run_summary(run.summary))
    if not facts:
        return None
    # values() loses the fields' types: these are RequestRecord's scalar fields and a sample's value.
    records = cast(
        list[RehearsalRecord],
        list(RecordRow.objects.filter(run=run).order_by("index").values(*SCALAR_RECORD_FIELDS)),
    )
    samples = cast(
        list[SampleValue],
        list(
            MetricSample.objects.filter(run=run, server="b0").values(
                "t_ns", "name", "kind", "value", "labels"
            )
        ),
    )
    measures = rehearsal_measures(
        records=records,
        planned=run.requests_planned or len(records),
        b0_samples=samples,
        classes=classes,
        switch_s=float(facts["switch_at_s"]),
        cut_s=float(facts["cut_at_s"]),
        end_s=run.warmup_seconds + run.observation_seconds,
        window_s=float(options["window_s"]),
        max_recovery_s=float(options["max_recovery_s"]),
        deadline_s=run.warmup_seconds + run.observation_seconds + run.drain_deadline_seconds,
    )
    measures["standby"] = facts.get("standby")
    measures["client"] = facts
    return measures
