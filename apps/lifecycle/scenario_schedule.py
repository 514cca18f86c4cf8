"""Failure-scenario runs planned, sized and frozen: the rows the scenarios need before they run.

Scenario runs are ordinary Run rows (``kind="scenario"``, ``scenario=<name>``) executed by the
same pipeline as the sweep; they follow the sweep in the plan (:func:`scenario_runs_build`).
Their traces are sized from B0's decode pace, measured by the capacity probe or by one short
pace run (:func:`scenario_pace_probe`), and frozen once (:func:`scenario_traces_freeze`) before
any run is dispatched. The generators are pure (apps/workloads/scenario_traces.py); what each run must
show and hold is judged from its records by apps/runs/scenario_reports.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.db import transaction

from apps.analysis.scenario_checks import decode_step_ms
from apps.experiments.models import Experiment, ServerConfig
from apps.lifecycle.runs import run_build
from apps.runs.models import RequestRecord, Run
from apps.runs.scenario_reports import failure_scenario_runs, scheduling_policy
from apps.workloads.models import Trace
from apps.workloads.prompts import PromptTokenizer
from apps.workloads.scenario_traces import (
    GENERATORS_OF,
    PRIORITY_CHECK,
    ScenarioContext,
    kv_capacity_tokens,
    scenario_trace,
    scenario_windows,
)
from apps.workloads.services import tokenizer_dir, trace_store
from apps.workloads.tracefile import Trace as TraceFile
from workers.replay.records import SCALAR_RECORD_FIELDS

SCENARIO_RATE_NAME = "scenario"


def probe_run_create(
    *,
    experiment: Experiment,
    cell: ServerConfig,
    trace: Trace,
    mixture: str,
    rate_name: str,
    rate_rps: float,
    position: int,
    windows: Mapping[str, Any],
    kind: str = Run.Kind.CALIBRATION,
) -> Run:
    """A queued probe run (``kind`` calibration or pace) replaying a stored trace on ``cell``.

    Capacity-probe steps, goodput searches and the pace run are all this: one
    engine run the caller executes inline, kept apart from the sweep.
    ``windows`` has ``warmup_s``, ``observation_s`` and ``drain_deadline_s``. Refused
    (RunsRefused) on an experiment that takes no more runs (Experiment.assert_accepts_runs).
    """
    with transaction.atomic():  # the experiment row stays locked until the run is written
        experiment.assert_accepts_runs(kind=kind)
        run = run_build(
            experiment=experiment,
            kind=kind,
            cell=cell,
            mixture=mixture,
            rate_name=rate_name,
            rate_rps=rate_rps,
            round_position=position,
            plan_position=position,
            windows=windows,
            trace=trace,
        )
        run.save()
        return run


def scenario_entries(
    *, spec: dict[str, Any], cells: list[ServerConfig]
) -> list[tuple[str, dict[str, Any], ServerConfig]]:
    """(scenario, params, cell) for every scenario run of the spec, in a stable order.

    Each scenario runs against B0 and the cells it lists (default: all).
    Every cell whose scheduler is ``priority`` also gets the short priority
    check, unless a priority_flood already runs against it.
    """
    baseline = next((c for c in cells if c.role == ServerConfig.Role.BASELINE), None)
    wanted = spec.get("scenarios") or {}
    out: list[tuple[str, dict[str, Any], ServerConfig]] = []
    for name in sorted(wanted):
        listed = wanted[name].get("cells")
        for cell in cells:
            if listed is None or cell.cell_id in listed or cell is baseline:
                out.append((name, dict(wanted[name].get("params") or {}), cell))
    flooded = {c.cell_id for name, _, c in out if GENERATORS_OF.get(name, name) == "priority_flood"}
    for cell in cells:
        if scheduling_policy(cell) == "priority" and cell.cell_id not in flooded:
            out.append((PRIORITY_CHECK, {}, cell))
    return out


def scenario_runs_build(
    *, experiment: Experiment, first_position: int, cells: list[ServerConfig] | None = None
) -> list[Run]:
    """Unsaved Run rows for the scenarios of ``cells`` (default: the experiment's), placed after
    the sweep in the plan."""
    if cells is None:
        cells = list(experiment.cells.all())
    runs = []
    for i, (name, params, cell) in enumerate(scenario_entries(spec=experiment.spec or {}, cells=cells)):
        windows = scenario_windows(name, params)
        runs.append(
            run_build(
                experiment=experiment,
                kind=Run.Kind.SCENARIO,
                scenario=name,
                cell=cell,
                mixture=name,
                rate_name=SCENARIO_RATE_NAME,
                rate_rps=0.0,  # the offered rate is known once the trace is frozen
                round_position=i,
                plan_position=first_position + i,
                windows=windows,
            )
        )
    return runs


def experiment_kv_capacity(*, experiment: Experiment) -> int | None:
    """Tokens of KV cache the experiment's controls give the model (None when not fixed)."""
    path = tokenizer_dir(experiment.model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return kv_capacity_tokens(model_config=config, kv_cache_memory_bytes=experiment.kv_cache_memory_bytes)


def experiment_pace(*, experiment: Experiment) -> tuple[float | None, str | None]:
    """B0's decode pace (ms per output token of one stream) from the capacity probe, and where from.

    The probe's lowest-rate finished step on B0 that has a pace: the least
    batching, so the closest to the step time of one stream alone (the bound
    apps/workloads/scenario_traces.py sizes the scenarios with). (None, None) when
    no probe ran.
    """
    probes = (
        experiment.runs.filter(
            kind__in=sorted(Run.PROBES), status=Run.Status.DONE, cell__role=ServerConfig.Role.BASELINE
        )
        .order_by("rate_rps", "plan_position")
        .only("pk", "run_id", "rate_rps", "mixture")
    )
    for run in probes:
        records = RequestRecord.objects.filter(run=run).values(*SCALAR_RECORD_FIELDS)
        pace = decode_step_ms(records)
        if pace is not None:
            return pace, f"probe run {run.run_id} (B0, {run.mixture}, {run.rate_rps:g} req/s)"
    return None, None


def scenario_context(*, experiment: Experiment) -> ScenarioContext:
    baseline = experiment.cells.filter(role=ServerConfig.Role.BASELINE).first()
    seqs = (baseline.args or {}).get("max_num_seqs") if baseline else None
    pace, source = experiment_pace(experiment=experiment)
    return ScenarioContext(
        classes=[
            {
                "name": c.name,
                "input_tokens": c.input_tokens,
                "output_tokens": c.output_tokens,
                "priority": c.priority,
            }
            for c in experiment.classes.all()
        ],
        max_model_len=experiment.max_model_len,
        seed=int(experiment.workload.seed),
        tokenizer_revision=experiment.tokenizer_revision,
        kv_capacity_tokens=experiment_kv_capacity(experiment=experiment),
        decode_step_ms=pace,
        pace_source=source,
        max_num_seqs=int(seqs) if seqs else None,
    )


# The pace probe: a few streams one after another on B0, when scenarios need sizing and
# no capacity probe measured the pace (Run.kind "pace", mixture and rate "pace").
PACE = "pace"
PACE_PARAMS = {"concurrency": 4, "ramp_s": 2.0, "observation_s": 2.5, "drain_deadline_s": 30.0}
PACE_OUTPUT_TOKENS = 128


def scenarios_need_pace(*, experiment: Experiment) -> bool:
    """True when failure scenarios are planned and no finished probe run on B0 gives a pace. A
    search plans its scenario runs only when it confirms (apps/lifecycle/search_steps.py), so
    there the spec's ``scenarios`` stand for them: the pace is measured at the start, with B0."""
    spec = experiment.spec or {}
    planned = failure_scenario_runs(experiment=experiment).exists() or bool(
        spec.get("search") and spec.get("scenarios")
    )
    return planned and experiment_pace(experiment=experiment)[0] is None


def pace_trace(*, context: ScenarioContext, tokenizer: PromptTokenizer) -> TraceFile:
    """The pace run's trace: four streams of the short class, 0.5 s apart, up to 128 tokens each."""
    short = min(context.classes, key=lambda c: (int(c["input_tokens"]), str(c["name"])))
    out = max(16, min(PACE_OUTPUT_TOKENS, context.max_model_len - int(short["input_tokens"])))
    return scenario_trace(
        name="decode_pressure",
        context=context,
        params={**PACE_PARAMS, "output_tokens": out},
        tokenizer=tokenizer,
    )


def scenario_pace_probe(*, experiment: Experiment, execute: Any) -> float | None:
    """Measure B0's decode pace with one short run (four streams, 0.5 s apart); returns it.

    Costs one engine run on the host. The run is an ordinary probe run
    (``kind="pace"``, mixture and rate ``pace``), so
    :func:`experiment_pace` finds it like a capacity probe's step.
    """
    trace = pace_trace(
        context=scenario_context(experiment=experiment),
        tokenizer=PromptTokenizer(tokenizer_dir(experiment.model_path)),
    )
    row = trace_store(trace=trace, label=f"{experiment.name} pace probe")
    run = probe_run_create(
        experiment=experiment,
        cell=experiment.cells.get(role=ServerConfig.Role.BASELINE),
        trace=row,
        mixture=PACE,
        rate_name=PACE,
        rate_rps=round(len(trace.requests) / float(trace.meta["observation_s"]), 6),
        position=experiment.runs.filter(kind__in=sorted(Run.PROBES)).count(),
        windows=trace.meta,
        kind=Run.Kind.PACE,
    )
    try:
        execute(run_pk=run.pk)
    except Exception as exc:
        # The pipeline marks its own failures; anything that escaped it still ends the run.
        Run.objects.filter(pk=run.pk).exclude(status__in=sorted(Run.FINISHED)).update(
            status=Run.Status.FAILED, reason=f"pace probe: {type(exc).__name__}: {exc}"[:500]
        )
        raise
    return experiment_pace(experiment=experiment)[0]


def scenario_traces_freeze(*, experiment: Experiment) -> dict[str, Trace]:
    """Generate and store each scenario's trace once (every cell replays the same bytes)."""
    spec = experiment.spec or {}
    names = sorted({r.scenario for r in failure_scenario_runs(experiment=experiment)})
    if not names:
        return {}
    params = {name: (spec.get("scenarios") or {}).get(name, {}).get("params") or {} for name in names}
    ctx = scenario_context(experiment=experiment)
    tok = PromptTokenizer(tokenizer_dir(experiment.model_path))
    traces = {
        name: scenario_trace(name=name, context=ctx, params=params[name], tokenizer=tok) for name in names
    }
    with transaction.atomic():
        return {
            name: trace_store(trace=t, label=f"{experiment.name} scenario {name}")
            for name, t in traces.items()
        }


def scenario_runs_attach(*, runs: list[Run], traces: dict[str, Trace]) -> None:
    """Point each scenario run at its frozen trace (in memory; the caller saves)."""
    for run in runs:
        row = traces[run.scenario]
        run.trace = row
        run.trace_sha256 = row.sha256
        run.corpus_sha256 = row.corpus_sha256
        run.requests_planned = row.requests
        obs = float((row.meta or {}).get("observation_s") or run.observation_seconds)
        run.rate_rps = round(row.requests / obs, 6) if obs > 0 else 0.0
