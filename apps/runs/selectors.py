"""What the pages, the report and the manifest read about runs' rates: no writes, no tasks.

``offered_load`` and the probe's settings live here, not beside the probe that
writes the rates (apps/lifecycle/calibration.py), so that approvals and experiments
read them without importing the probe.
"""

from __future__ import annotations

from typing import Any

from apps.experiments.models import Experiment
from apps.experiments.spec import CALIBRATION_DEFAULTS
from apps.runs.record_names import aliases, windows
from apps.runs.summary_types import run_summary

# Where a capacity search is stored in Workload.rates_derivation (apps/lifecycle/calibration.py):
# cell -> mixture -> search for a goodput search, cell -> class -> search for a class's capacity
# alone (an isolate decision's pools read it, apps/analysis/pool_sizing.py).
GOODPUT, CLASS_CAPACITY = "goodput_capacity", "class_capacity"


def calibration_settings(experiment: Experiment) -> dict[str, Any] | None:
    """The spec's calibration block (normalised by apps/experiments/spec.py), or None."""
    cal = (experiment.spec or {}).get("calibration")
    return dict(cal) if cal and cal.get("enabled", True) else None


def goodput_settings(experiment: Experiment) -> dict[str, Any]:
    """The search settings a goodput-capacity measurement uses: the calibration block's, else the defaults."""
    return calibration_settings(experiment) or dict(CALIBRATION_DEFAULTS)


def offered_load(*, experiment: Experiment) -> dict[str, Any]:
    """Where the sweep's rates came from, in the words the UI, the report and the manifest use.

    ``source``: ``manual`` (typed in the spec) or ``probe`` (frozen from B0's
    measured capacity); ``frozen``: whether they are final (a probe that has
    not run yet leaves provisional values); then the probe's capacities,
    binding mixture, fractions and runs, and any goodput capacity per cell
    (labelled as measured per cell, never used as a rate) and capacity per cell for one class
    alone (``class_capacity``: what an isolate decision sizes its pools from).
    """
    workload = experiment.workload
    d = workload.rates_derivation or {}
    rates = dict(workload.rates or {})
    out: dict[str, Any] = {
        "source": workload.rates_source,
        "values": rates,
        "per_mixture": {
            m: {name: workload.rate_for(m, name) for name in sorted(rates)} for m in sorted(workload.mixtures)
        },
        "mixture_specific": bool(workload.mixture_rates),
    }
    if workload.rates_source == "probe" and d.get("rates"):
        fractions = ", ".join(f"{name} {float(f):g}" for name, f in sorted(d["fractions"].items()))
        steps = sum(len(p["steps"]) for p in d.get("probes", []))
        if d.get("mixture_rates"):
            caps = ", ".join(f"{m} {float(c):g}" for m, c in sorted(d["capacities"].items()))
            said = (
                f"frozen per mixture from B0's measured capacity: {fractions} of each mixture's own "
                f"capacity ({caps} req/s; {steps} probe runs)"
            )
        else:
            cap = d["capacities"][d["binding_mixture"]]
            said = (
                f"frozen from B0's measured capacity: {fractions} of {cap:g} req/s "
                f"(mixture {d['binding_mixture']}, the first to saturate; {steps} probe runs)"
            )
        out.update(
            frozen=True,
            said=said,
            capacities=d["capacities"],
            bracketed=d.get("bracketed", {}),
            binding_mixture=d["binding_mixture"],
            fractions=d["fractions"],
            frozen_at=d.get("frozen_at"),
            probes=[
                {
                    "mixture": p["mixture"],
                    "capacity_rps": p["capacity_rps"],
                    "steps": [
                        {
                            k: st.get(k)
                            for k in ("step", "run", "rate_rps", "status", "passed", "failed_because")
                        }
                        for st in p["steps"]
                    ],
                }
                for p in d.get("probes", [])
            ],
        )
    elif workload.rates_source == "probe":
        out.update(
            frozen=False,
            said="provisional: the capacity probe on B0 freezes the rates when the experiment starts, "
            "before any candidate runs",
        )
    else:
        out.update(
            frozen=True,
            said="typed by hand in the spec (workload.rates), frozen when the experiment was created",
        )
    # Each cell's goodput searches by mixture, and its capacity searches for one class alone by class.
    for section in (GOODPUT, CLASS_CAPACITY):
        searches = d.get(section) or {}
        if searches:
            out[section] = {
                cell: {
                    key: {
                        "status": s.get("status", "done"),
                        "capacity_rps": s.get("capacity_rps"),
                        "bracketed": s.get("bracketed"),
                        "steps": len(s.get("steps") or []),
                        "reason": s.get("reason"),
                    }
                    for key, s in sorted(per.items())
                }
                for cell, per in sorted(searches.items())
            }
    return out


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def run_record(run: Any) -> dict[str, Any]:
    """One run as an export: the run record under the method's names (apps/runs/record_names.py),
    then how it went (values it does not have are null), then the older names as aliases.

    ``run`` is a :class:`apps.runs.models.Run` with its cell, experiment and host loaded.
    """
    record: dict[str, Any] = {
        "run_id": str(run.run_id),
        "cell_id": run.cell.cell_id,
        "mixture": run.mixture,
        "rate": run.rate_name,
        "rate_rps": run.rate_rps,
        "repeat": run.repeat,
        "position": run.round_position,
        "scenario": run.scenario_label,
        "status": run.status,
        "trace_sha256": run.trace_sha256,
        "corpus_sha256": run.corpus_sha256,
        "image_digest": run.image_digest,
        "vllm_version": run.vllm_version,
        "model_revision": run.model_revision,
        "tokenizer_revision": run.tokenizer_revision,
        "hardware_id": run.hardware_id,
        "effective_args": run.effective_args,
        "generation": run.generation,
        "dispatch_lag_p99_ms": run.dispatch_lag_p99_ms,
        **windows(run.warmup_seconds, run.observation_seconds, run.drain_deadline_seconds),
    }
    summary = run_summary(run.summary)
    record.update(
        experiment=run.experiment_id,
        reason=run.reason,
        attempts=run.attempts,
        retry_of=str(run.retry_of.run_id) if run.retry_of_id else None,
        host=run.host.name if run.host_id else None,
        requests_planned=run.requests_planned,
        requests_sent=run.requests_sent,
        dispatch_lag_p50_ms=run.dispatch_lag_p50_ms,
        dispatch_lag_max_ms=run.dispatch_lag_max_ms,
        loop_stall_max_ms=summary.get("loop_stall_max_ms"),
        send_priority=summary.get("send_priority"),
        achieved_rate_rps=run.achieved_rate_rps,
        created_at=_iso(run.created_at),
        started_at=_iso(run.started_at),
        finished_at=_iso(run.finished_at),
        summary=summary or None,
    )
    # The older names (cell, window), kept for consumers of the earlier export.
    record.update(aliases(record))
    return record
