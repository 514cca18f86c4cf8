"""The capacity probe: find B0's capacity per mixture, then freeze the sweep's rates from it.

Rates guessed per candidate until each "looks healthy" make every comparison
meaningless; here they come from one measurement, taken before the first
candidate runs, and every cell then faces exactly the same offered load.

Steps of :func:`experiment_calibrate`:

1. For each mixture (all, or ``calibration.mixtures``), replay B0 at stepped
   rates (:func:`next_rate`: doubling from ``start_rps`` until a step fails,
   then bisecting between the highest pass and the lowest failure until the
   bracket is within ``tolerance``, at most ``max_steps`` steps). Each step is
   a real Run (``kind="calibration"``) with its own generated trace and
   the probe's short observation window, executed by the run pipeline.
2. A step passes when the run is ``done`` and every class of the mixture
   keeps its contract with accepted / offered >= ``min_accepted_share``
   (default 99 %), judged by apps/analysis/metrics.py on the run's records.
3. The capacity of a mixture is the highest passing rate below the lowest
   failing one. Each mixture's rates are the configured fractions (default
   ``low`` 0.3, ``near_capacity`` 0.9) of its own capacity
   (``Workload.mixture_rates``), so "near capacity" is near *that*
   mixture's capacity. ``calibration.rates_per: experiment`` instead takes
   one set of rates, fractions of the smallest capacity (the mixture that
   saturates first binds). ``Workload.rates`` always holds the binding
   mixture's, used by any mixture the probe skipped.
4. Workload.rates, mixture_rates, rates_source="probe" and rates_derivation
   (every probe run, its result, the capacities and the chosen values) are
   written in one transaction together with every planned sweep run's
   rate_rps.

The search itself (``next_rate``, ``capacity_of``, ``probe_passed``,
``frozen_rates``) is pure, in apps/runs/capacity.py, and tested without an
engine; what the page, report and manifest say of the rates is
apps/runs/selectors.offered_load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from django.db import transaction
from django.utils import timezone

from apps.analysis.columns import RecordTable
from apps.analysis.metrics import Contract, class_metrics, derive, run_window
from apps.audit.services import audit_record
from apps.experiments.models import Experiment, ServerConfig, Workload
from apps.lifecycle.scenario_schedule import probe_run_create
from apps.runs import dispatch
from apps.runs.capacity import capacity_of, frozen_rates, next_rate, probe_passed
from apps.runs.hosts import hosts_alive
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.models import Run
from apps.runs.selectors import CLASS_CAPACITY, GOODPUT, calibration_settings, goodput_settings
from apps.workloads.corpus_store import experiment_corpus_prompts
from apps.workloads.generate import generate_trace
from apps.workloads.prompts import PromptTokenizer
from apps.workloads.services import tokenizer_dir, trace_classes, trace_store
from workers.replay.records import SCALAR_RECORD_FIELDS, RequestRecord

log = logging.getLogger(__name__)

Executor = Callable[..., str]


class CalibrationError(RuntimeError):
    """The probe could not find a capacity (the message says for which mixture and why)."""


# -- one step against the database ------------------------------------------


def run_class_metrics(*, run: Run, contracts: Mapping[str, Contract]) -> dict[str, dict[str, Any]]:
    """Per-class metrics of one finished run, by apps/analysis/metrics.py (cohort, censoring, contract)."""
    # The histograms are not needed to judge a contract on TTFT, end-to-end latency, max stall and errors.
    rows = [
        RequestRecord(run_id=str(run.run_id), **values)
        for values in RecordRow.objects.filter(run=run).order_by("index").values(*SCALAR_RECORD_FIELDS)
    ]
    window = run_window(
        {
            "warmup_s": run.warmup_seconds,
            "observation_s": run.observation_seconds,
            "drain_deadline_s": run.drain_deadline_seconds,
        }
    )
    table = RecordTable.from_records(rows)
    d = derive(table, {str(run.run_id): window}, contracts)
    out = {}
    for name, contract in contracts.items():
        if name in table.class_names:
            code = table.class_names.index(name)
            picked = np.flatnonzero(d.cohort & (table.cls == code))
        else:
            picked = np.zeros(0, dtype=np.int64)
        out[name] = class_metrics(d, picked, contract=contract, observation_s=window.observation_s)
    return out


def _contracts(experiment: Experiment) -> dict[str, Contract]:
    return {
        c.name: Contract(
            ttft_p99_ms=c.ttft_p99_ms,
            e2e_p99_ms=c.e2e_p99_ms,
            max_stall_ms=c.max_stall_ms,
            error_rate=c.error_rate,
        )
        for c in experiment.classes.all()
    }


def probe_step(
    *,
    experiment: Experiment,
    cell: ServerConfig,
    mixture: str,
    rate_rps: float,
    step: int,
    settings: Mapping[str, Any],
    execute: Executor,
    tokenizer: PromptTokenizer,
    weights: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Generate, store and replay one probe trace against ``cell``; judge the run.

    ``weights``: the class mix to replay (default: the spec's mixture ``mixture``); a class's
    capacity alone replays ``{class: 1.0}`` under the label ``mixture``.
    """
    workload = experiment.workload
    mix = dict(weights) if weights is not None else workload.mixtures[mixture]
    rate_name = f"probe{step}"
    trace = generate_trace(
        classes=trace_classes(experiment),
        mixture_name=mixture,
        mixture=mix,
        rate_name=rate_name,
        rate_rps=rate_rps,
        arrival_process=workload.arrival_process,
        arrival_cv=workload.arrival_cv,
        seed=workload.seed,
        repeat=1,
        warmup_s=float(settings["warmup_s"]),
        observation_s=float(settings["observation_s"]),
        tokenizer_dir=tokenizer_dir(experiment.model_path),
        tokenizer_revision=experiment.tokenizer_revision,
        tokenizer=tokenizer,
        corpus=experiment_corpus_prompts(experiment),
    )
    row = trace_store(trace=trace, label=f"{experiment.name} probe {cell.cell_id} {mixture} {rate_rps:g} rps")
    run = probe_run_create(
        experiment=experiment,
        cell=cell,
        trace=row,
        mixture=mixture,
        rate_name=rate_name,
        rate_rps=rate_rps,
        position=step,
        windows=settings,
    )
    execute(run_pk=run.pk)
    run.refresh_from_db()
    per_class = run_class_metrics(run=run, contracts=_contracts(experiment))
    passed, reasons = probe_passed(
        status=run.status,
        per_class=per_class,
        weights=mix,
        min_accepted_share=float(settings["min_accepted_share"]),
    )
    return {
        "step": step,
        "run": str(run.run_id),
        "rate_rps": rate_rps,
        "status": run.status,
        "reason": run.reason[:300],
        "trace_sha256": row.sha256,
        "passed": passed,
        "failed_because": reasons,
        "classes": {
            name: {
                "offered": m["counts"]["offered"],
                "accepted_share": m["accepted_share"],
                "contract_met": m["contract"]["met"],
                "ttft_p99": m["ttft_ms"]["p99"],
                "e2e_p99": m["e2e_ms"]["p99"],
                "max_stall_p99": m["max_stall_ms"]["p99"],
                "goodput_rps": m["goodput_rps"],
            }
            for name, m in per_class.items()
        },
    }


def capacity_search(
    *,
    experiment: Experiment,
    cell: ServerConfig,
    mixture: str,
    settings: Mapping[str, Any],
    execute: Executor,
    tokenizer: PromptTokenizer | None = None,
    first_step: int = 0,
    weights: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The stepped search of one (cell, mixture): every step, and the capacity it found
    (``weights``: another class mix than the spec's mixture, as probe_step takes it)."""
    tok = tokenizer or PromptTokenizer(tokenizer_dir(experiment.model_path))
    history: list[tuple[float, bool]] = []
    steps: list[dict[str, Any]] = []
    while True:
        rate = next_rate(
            history=history,
            start_rps=float(settings["start_rps"]),
            tolerance=float(settings["tolerance"]),
            max_steps=int(settings["max_steps"]),
        )
        if rate is None:
            break
        if experiment.__class__.objects.filter(pk=experiment.pk, status=Experiment.Status.CANCELLED).exists():
            raise CalibrationError("the experiment was cancelled during the capacity probe")
        result = probe_step(
            experiment=experiment,
            cell=cell,
            mixture=mixture,
            rate_rps=rate,
            step=first_step + len(steps),
            settings=settings,
            execute=execute,
            tokenizer=tok,
            weights=weights,
        )
        log.info(
            "probe %s %s %.4g rps: %s", cell.cell_id, mixture, rate, "pass" if result["passed"] else "fail"
        )
        steps.append(result)
        history.append((rate, result["passed"]))
    capacity, bracketed = capacity_of(history)
    return {
        "cell": cell.cell_id,
        "mixture": mixture,
        "capacity_rps": capacity,
        "bracketed": bracketed,
        "steps": steps,
    }


def experiment_calibrate(*, experiment_id: int, execute: Executor, actor: Any = None) -> dict[str, Any]:
    """Probe B0's capacity and freeze the sweep's rates (module docstring); returns the derivation.

    ``execute`` runs one run to the end (workers.pipeline.run_execute, called
    inline by the worker that serves this host: one run at a time). Raises
    CalibrationError, leaving the rates untouched, when a mixture has no
    passing rate.
    """
    experiment = Experiment.objects.select_related("workload").get(pk=experiment_id)
    settings = calibration_settings(experiment)
    if settings is None:
        raise CalibrationError("the spec has no enabled calibration block")
    if (
        experiment.runs.filter(kind=Run.Kind.SWEEP)
        .exclude(status__in=[Run.Status.QUEUED, Run.Status.CANCELLED])
        .exists()
    ):
        raise CalibrationError("sweep runs have started already: rates must be frozen before the first one")
    workload = experiment.workload
    baseline = experiment.cells.get(role=ServerConfig.Role.BASELINE)
    mixtures = settings.get("mixtures") or sorted(workload.mixtures)
    tok = PromptTokenizer(tokenizer_dir(experiment.model_path))
    searches: list[dict[str, Any]] = []
    for mixture in mixtures:
        done_steps = sum(len(s["steps"]) for s in searches)
        searches.append(
            capacity_search(
                experiment=experiment,
                cell=baseline,
                mixture=mixture,
                settings=settings,
                execute=execute,
                tokenizer=tok,
                first_step=done_steps,
            )
        )
    missing = [s["mixture"] for s in searches if s["capacity_rps"] is None]
    if missing:
        raise CalibrationError(
            f"no probed rate passed for mixture(s) {', '.join(missing)} (lowest tried "
            f"{min(st['rate_rps'] for s in searches for st in s['steps']):g} req/s): lower "
            "calibration.start_rps or check the contracts"
        )
    binding = min(searches, key=lambda s: (s["capacity_rps"], s["mixture"]))
    rates = frozen_rates(capacity_rps=float(binding["capacity_rps"]), fractions=settings["fractions"])
    rates_per = settings.get("rates_per") or "mixture"
    mixture_rates = (
        {
            s["mixture"]: frozen_rates(capacity_rps=float(s["capacity_rps"]), fractions=settings["fractions"])
            for s in searches
        }
        if rates_per == "mixture"
        else {}
    )
    derivation = {
        "method": "stepped probe on B0: doubling, then bisection",
        "baseline": baseline.cell_id,
        "settings": settings,
        "capacities": {s["mixture"]: s["capacity_rps"] for s in searches},
        "bracketed": {s["mixture"]: s["bracketed"] for s in searches},
        "binding_mixture": binding["mixture"],
        "fractions": settings["fractions"],
        "rates_per": rates_per,
        "rates": rates,
        "mixture_rates": mixture_rates,
        "probes": searches,
        "frozen_at": timezone.now().isoformat(),
    }
    with transaction.atomic():
        Workload.objects.filter(pk=workload.pk).update(
            rates=rates, mixture_rates=mixture_rates, rates_source="probe", rates_derivation=derivation
        )
        workload.rates, workload.mixture_rates = rates, mixture_rates
        swept = experiment.runs.filter(kind__in=[Run.Kind.SWEEP, Run.Kind.UNIFORM])
        for mixture, name in set(swept.values_list("mixture", "rate_name")):
            swept.filter(mixture=mixture, rate_name=name).update(rate_rps=workload.rate_for(mixture, name))
        audit_record(
            action="experiment.calibrated",
            actor=actor,
            experiment=experiment,
            detail={"rates": rates, "mixture_rates": mixture_rates, "capacities": derivation["capacities"]},
        )
    return derivation


def calibration_runs_retire(*, experiment: Experiment) -> int:
    """Cancel probe runs left queued (a restart re-queues cancelled runs; a probe step is never resumed)."""
    return Run.objects.filter(
        experiment=experiment, kind__in=sorted(Run.PROBES), status=Run.Status.QUEUED
    ).update(
        status=Run.Status.CANCELLED,
        reason="probe step not resumed after a restart",
        finished_at=timezone.now(),
    )


def calibration_pending(*, experiment: Experiment) -> bool:
    """True when the spec asks for the probe and no probe has frozen the rates yet."""
    if calibration_settings(experiment) is None:
        return False
    return not (experiment.workload.rates_derivation or {}).get("rates")


def _goodput_store(
    *, workload_pk: int, cell_id: str, mixture: str, entry: Mapping[str, Any], section: str = GOODPUT
) -> None:
    """Store one search under ``section`` (GOODPUT: by mixture; CLASS_CAPACITY: ``mixture`` is the class)."""
    with transaction.atomic():
        workload = Workload.objects.select_for_update().get(pk=workload_pk)
        derivation = dict(workload.rates_derivation or {})
        per_cell = dict(derivation.get(section) or {})
        per_cell[cell_id] = {**dict(per_cell.get(cell_id) or {}), mixture: dict(entry)}
        derivation[section] = per_cell
        workload.rates_derivation = derivation
        workload.save(update_fields=["rates_derivation"])


def class_alone_label(request_class: str) -> str:
    """The mixture label of a class's capacity search (Run.mixture holds 64 characters)."""
    return f"{request_class[:58]} alone"


def cell_goodput_capacity(
    *, experiment_id: int, cell_id: str, mixture: str, execute: Executor, request_class: str = ""
) -> dict[str, Any]:
    """Goodput capacity of any cell for one mixture: the same stepped search, against that cell.

    Costs one run per step on the host; stored beside the derivation under
    ``goodput_capacity`` (cell -> mixture -> search, with ``status`` done or
    failed) and never used to set rates. A crash is stored as ``failed`` with
    its reason before it propagates, so the UI never shows a search queued forever.

    With ``request_class`` (``mixture`` is then ignored) it measures the cell's capacity for that
    class alone: the same search on a mixture of that one class, judged on that class's contract,
    stored under ``class_capacity`` (cell -> class -> search). An isolate decision sizes its pools
    from it (apps/analysis/pool_sizing.py).
    """
    experiment = Experiment.objects.select_related("workload").get(pk=experiment_id)
    settings = goodput_settings(experiment)
    cell = experiment.cells.get(cell_id=cell_id)
    first = Run.objects.filter(experiment=experiment, kind__in=sorted(Run.PROBES)).count()
    section, key, weights = GOODPUT, mixture, None
    if request_class and not experiment.classes.filter(name=request_class).exists():
        raise CalibrationError(f"class: no class {request_class!r} in this experiment")
    if request_class:
        section, key, weights = CLASS_CAPACITY, request_class, {request_class: 1.0}
        mixture = class_alone_label(request_class)
    try:
        # Before the first trace is generated; each step's run is refused on its own as well.
        experiment.assert_accepts_runs(kind=Run.Kind.CALIBRATION)
        search = capacity_search(
            experiment=experiment,
            cell=cell,
            mixture=mixture,
            settings=settings,
            execute=execute,
            first_step=first,
            weights=weights,
        )
    except Exception as exc:
        _goodput_store(
            workload_pk=experiment.workload.pk,
            cell_id=cell_id,
            mixture=key,
            entry={"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500]},
            section=section,
        )
        raise
    search["kind"] = (
        f"capacity for {request_class} alone: highest rate of {request_class}'s requests alone at which "
        "it keeps its contract on this cell"
        if request_class
        else "goodput capacity: highest rate at which every class keeps its contract on this cell"
    )
    search["status"] = "done"
    search["measured_at"] = timezone.now().isoformat()
    _goodput_store(
        workload_pk=experiment.workload.pk, cell_id=cell_id, mixture=key, entry=search, section=section
    )
    return search


class GoodputRequestError(ValueError):
    """A goodput-capacity measurement cannot be queued (the message says why)."""


def goodput_capacity_request(
    *, experiment: Experiment, cell_id: str, mixture: str, actor: Any = None, request_class: str = ""
) -> str:
    """Queue a cell's goodput-capacity search on a live host; returns the host's name.

    Refused (GoodputRequestError) for an unknown cell or mixture, while the
    same search is queued, or with no live host; RunsRefused when the experiment
    takes no more runs (analysed or decided: Experiment.assert_accepts_runs). The
    search is marked ``queued`` in the derivation at once, so the UI shows it is on its way.
    With ``request_class`` the search measures the cell's capacity for that class alone
    (cell_goodput_capacity); ``mixture`` is then not read.
    """
    experiment.assert_accepts_runs(kind=Run.Kind.CALIBRATION)
    if not experiment.cells.filter(cell_id=cell_id).exists():
        raise GoodputRequestError(f"cell: no cell {cell_id!r} in this experiment")
    if request_class:
        if not experiment.classes.filter(name=request_class).exists():
            raise GoodputRequestError(f"class: no class {request_class!r} in this experiment")
        section, key, what = (
            CLASS_CAPACITY,
            request_class,
            f"the capacity of {cell_id} for {request_class} alone",
        )
    else:
        if mixture not in (experiment.workload.mixtures or {}):
            raise GoodputRequestError(f"mixture: no mixture {mixture!r} in this experiment")
        section, key, what = GOODPUT, mixture, f"the goodput capacity of {cell_id} on {mixture}"
    current = ((experiment.workload.rates_derivation or {}).get(section) or {}).get(cell_id, {})
    if (current.get(key) or {}).get("status") == "queued":
        raise GoodputRequestError(f"{what} is being measured already")
    hosts = hosts_alive(max_model_len=experiment.max_model_len)
    if not hosts:
        raise GoodputRequestError(
            "no host is alive to run the search (start one with `make run` or `make worker`)"
        )
    host = hosts[0]
    with transaction.atomic():
        _goodput_store(
            workload_pk=experiment.workload.pk,
            cell_id=cell_id,
            mixture=key,
            entry={
                "status": "queued",
                "host": host.name,
                "requested_at": timezone.now().isoformat(),
                "requested_by": getattr(actor, "username", None),
            },
            section=section,
        )
        where = {"class": request_class} if request_class else {"mixture": mixture}
        audit_record(
            action="experiment.goodput_capacity_requested",
            actor=actor,
            experiment=experiment,
            detail={"cell": cell_id, **where, "host": host.name},
        )
        kwargs: dict[str, Any] = {"experiment_pk": experiment.pk, "cell_id": cell_id, "mixture": mixture}
        if request_class:
            kwargs["request_class"] = request_class
        dispatch.send_on_commit(dispatch.CELL_GOODPUT_CAPACITY, kwargs=kwargs, queue=host.queue)
    return host.name
