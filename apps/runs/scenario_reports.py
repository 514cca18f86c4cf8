"""Failure-scenario runs judged: what each one had to show and hold, from its records.

The checks are pure (apps/analysis/scenario_checks.py); this module reads the rows they judge. The
runs are planned and their traces frozen by apps/lifecycle/scenario_schedule.py.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from apps.analysis.scenario_checks import scenario_verdict, scenarios_summary
from apps.analysis.server_metrics import server_metrics
from apps.experiments.models import Experiment, ServerConfig
from apps.runs.models import MetricSample, RequestRecord, Run
from workers.replay.records import SCALAR_RECORD_FIELDS


def failure_scenario_runs(*, experiment: Experiment) -> QuerySet[Run]:
    """The experiment's failure-scenario runs (not the sweep, the probe's runs or the uniform companions)."""
    return experiment.runs.filter(kind=Run.Kind.SCENARIO)


def scheduling_policy(cell: ServerConfig) -> str:
    return str((cell.args or {}).get("scheduling_policy") or "fcfs")


def scenario_reports(*, experiment_id: int) -> dict[str, Any]:
    """Every scenario run of the experiment judged (apps/analysis/scenario_checks.py), plus the probe's derivation.

    Runs that never finished are listed with their status and no verdict.
    """
    experiment = Experiment.objects.select_related("workload").get(pk=experiment_id)
    runs = list(
        failure_scenario_runs(experiment=experiment)
        .select_related("cell", "trace")
        .order_by("plan_position", "id")
    )
    verdicts = []
    listed = []
    for run in runs:
        entry: dict[str, Any] = {
            "run": str(run.run_id),
            "scenario": run.scenario,
            "cell": run.cell.cell_id,
            "scheduling_policy": scheduling_policy(run.cell),
            "status": run.status,
            "reason": run.reason,
            "trace_sha256": run.trace_sha256,
        }
        if run.status in Run.FINISHED and run.trace is not None and run.status != Run.Status.CANCELLED:
            records = list(
                RequestRecord.objects.filter(run=run).order_by("index").values(*SCALAR_RECORD_FIELDS)
            )
            samples = list(
                MetricSample.objects.filter(run=run).values(
                    "t_ns", "phase", "epoch", "name", "labels", "kind", "value"
                )
            )
            verdict = scenario_verdict(
                meta=run.trace.meta,
                records=records,
                server=server_metrics(samples),
                status=run.status,
                scheduling_policy=scheduling_policy(run.cell),
                replay=run.summary or {},
            )
            entry["verdict"] = verdict
            verdicts.append(verdict)
        listed.append(entry)
    workload = experiment.workload
    return {
        "summary": scenarios_summary(verdicts),
        "runs": listed,
        "rates": {
            "values": workload.rates,
            "source": workload.rates_source,
            "derivation": workload.rates_derivation,
        },
    }
