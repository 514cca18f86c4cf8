"""Approve or reject an analysed experiment (approving freezes its rollback manifest); revoke an approval.

Over 500 lines on purpose: it is one workflow. Everything here serves the approval's single
transaction: its refusals (role, author, status, checks 3 and 4 and their typed overrides), the
records the manifest states, read from the database under the experiment's row lock (B0's and
the candidate's cells, the rollback reserve, the evidence), and the rows written together
(Approval, RollbackManifest, the status, the audit event); reject and revoke share its checks.
The manifest's pure form and digest are apps/approvals/manifest.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from apps.accounts.roles import APPROVER, has_role
from apps.analysis.models import Decision
from apps.analysis.report_types import PoolSizing
from apps.approvals import manifest as mf
from apps.approvals.manifest_types import (
    ApprovedCandidate,
    BaselineRecord,
    CellRecord,
    EffectiveArgs,
    Evidence,
    RecoveryEvidence,
    RollbackReserve,
    ScenarioEvidence,
)
from apps.approvals.models import Approval, Revocation, RollbackManifest
from apps.experiments.models import Experiment, ServerConfig
from apps.experiments.recovery import recovery_options
from apps.experiments.spec_capture import b0_origin
from apps.lifecycle.transition import experiment_transition
from apps.runs.models import Run
from apps.runs.selectors import offered_load
from workers.engine import vllm_args


class ApprovalError(ValueError):
    """The experiment cannot be approved in its present state, or with that choice.

    ``field`` names the input at fault when one is (the form and the API show it there).
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _check(experiment: Experiment, approver: Any) -> Decision:
    if not has_role(approver, APPROVER):
        raise PermissionDenied("only approvers can approve or reject an experiment")
    if experiment.owner_id == approver.pk:
        raise PermissionDenied("the author of an experiment cannot approve or reject it")
    if experiment.status != Experiment.Status.ANALYSED:
        raise ApprovalError(
            f"the experiment is {experiment.status}; only an analysed experiment can be approved"
        )
    decision = Decision.objects.filter(experiment=experiment).first()
    if decision is None:
        raise ApprovalError("the experiment has no decision yet; analyse it first")
    return decision


def _locked(experiment: Experiment) -> Experiment:
    # Re-read under a row lock: two approvers clicking at once get one approval.
    # No joins here: Postgres cannot lock the nullable side of an outer join (the workload).
    return Experiment.objects.select_for_update().get(pk=experiment.pk)


def _cell_record(experiment: Experiment, cell: ServerConfig) -> CellRecord:
    runs = list(
        cell.runs.filter(status=Run.Status.DONE, kind=Run.Kind.SWEEP)
        .order_by("plan_position")
        .values("effective_args", "image_digest", "hardware_id", "vllm_version")
    )
    first: Mapping[str, Any] = dict(runs[0]) if runs else {}
    effective = mf.effective_args(cell.args, [r["effective_args"] for r in runs])
    _complete(effective, str(first.get("vllm_version") or ""))
    return {
        "cell_id": cell.cell_id,
        "effective_args": effective,
        "requested_args": cell.args,
        "image_digest": first.get("image_digest") or "",
        "vllm_version": first.get("vllm_version") or "",
        "hardware_id": first.get("hardware_id") or "",
    }


def _complete(effective: EffectiveArgs, version: str) -> None:
    """Add the complete effective arguments (manifest.complete_args) from the flag catalogue of the
    vLLM version the cell's runs reported, or say why there are none."""
    if effective["source"] != mf.CONFIRMED:
        effective["complete_from"] = "none: no run confirmed the args the engine ran with"
        return
    try:
        catalogue = vllm_args.catalogue(version or None)
    except vllm_args.UnknownVersion:
        effective["complete_from"] = f"none: no flag catalogue for vLLM {version or '(version not reported)'}"
        return
    effective["complete"] = mf.complete_args(effective["args"], catalogue.defaults(), catalogue.flags)
    effective["complete_from"] = (
        f"vLLM {catalogue.version}'s parser defaults, overlaid with the args the engine confirmed "
        "and logged as non-default"
    )


def _baseline_record(
    experiment: Experiment, b0: ServerConfig, *, deployment_revision: str, route_target: str
) -> BaselineRecord:
    cell = _cell_record(experiment, b0)
    w = experiment.workload
    baseline_spec = (experiment.spec or {}).get("baseline") or {}
    record: BaselineRecord = {
        "cell_id": b0.cell_id,
        "image": experiment.engine_image,
        "image_digest": cell["image_digest"] or None,
        "vllm_version": cell["vllm_version"] or None,
        "model": {"path": experiment.model_path, "revision": experiment.model_revision},
        "tokenizer_revision": experiment.tokenizer_revision,
        "effective_args": cell["effective_args"],
        "requested_args": cell["requested_args"],
        "controls": {
            "dtype": experiment.dtype,
            "tensor_parallel_size": experiment.tensor_parallel_size,
            "max_model_len": experiment.max_model_len,
            "gpu_memory_utilization": experiment.gpu_memory_utilization,
            "kv_cache_memory_bytes": experiment.kv_cache_memory_bytes,
            # Pinned explicitly: a rollback must not silently change either.
            "enable_prefix_caching": bool(experiment.enable_prefix_caching),
            "speculative_decoding": bool(experiment.speculative_decoding),
            "seed": experiment.engine_seed,
            "generation": experiment.generation,
        },
        "deployment": {
            # The approver's own fields (required); never guessed from captured_from (free text
            # about B0's origin).
            "revision": deployment_revision,
            "captured_from": b0.captured_from,
            "route_target": route_target,
        },
        "health_probe": mf.HEALTH_PROBE,
        "capacity": {
            "hardware_id": cell["hardware_id"] or None,
            "tensor_parallel_size": experiment.tensor_parallel_size,
            "gpu_memory_utilization": experiment.gpu_memory_utilization,
            "kv_cache_memory_bytes": experiment.kv_cache_memory_bytes,
            "max_model_len": experiment.max_model_len,
            "rollback_reserve": _rollback_reserve(experiment),
        },
        "drain_deadline_seconds": w.drain_deadline_s,
        # A rollout aborts (and rolls back) when a class breaks its contract.
        "abort_thresholds": {
            rc.name: {
                "ttft_p99_ms": rc.ttft_p99_ms,
                "e2e_p99_ms": rc.e2e_p99_ms,
                "max_stall_ms": rc.max_stall_ms,
                "error_rate": rc.error_rate,
            }
            for rc in experiment.classes.all()
        },
        "owner": experiment.owner.get_username(),
        # Captured from production (its source, time and digest), or "B0 typed by hand".
        "b0_origin": b0_origin(baseline_spec),
    }
    if isinstance(baseline_spec.get("capture"), Mapping):
        record["capture"] = baseline_spec["capture"]
    return record


def _rollback_reserve(experiment: Experiment) -> RollbackReserve:
    """The capacity that must stay reserved so that B0 can take the traffic back.

    One B0 server for every candidate server, on the same hardware with the same controls: kept
    up and warm (``warm`` standby) or free to start within ``max_recovery_s`` (``cold``), as the
    spec's recovery section rehearsed it.
    """
    options = recovery_options(experiment.spec or {})
    gpus = int(experiment.tensor_parallel_size or 1)
    standby = options.get("standby") or "warm"
    kept = (
        "kept up and warmed beside the candidate"
        if standby == "warm"
        else (f"kept free, so that B0 starts and serves within {options.get('max_recovery_s')} s")
    )
    return {
        "servers_per_candidate_server": 1,
        "gpus_per_server": gpus,
        "gpu_memory_utilization": experiment.gpu_memory_utilization,
        "kv_cache_memory_bytes": experiment.kv_cache_memory_bytes,
        "standby": standby,
        "max_recovery_s": options.get("max_recovery_s"),
        "statement": f"reserve one B0 server ({gpus} GPU{'s' if gpus != 1 else ''}) per candidate server, {kept}",
    }


def _offered_load(experiment: Experiment) -> dict[str, Any]:
    """How the sweep's rates were set (typed or probed), with the probe's runs by id, not in full."""
    load = offered_load(experiment=experiment)
    probes = load.pop("probes", None)
    if probes is not None:
        load["probe_runs"] = {
            p["mixture"]: [
                {"run": st["run"], "rate_rps": st["rate_rps"], "passed": st["passed"]} for st in p["steps"]
            ]
            for p in probes
        }
    return load


def _evidence(
    experiment: Experiment,
    decision: Decision,
    *,
    failure_scenarios: ScenarioEvidence,
    recovery: RecoveryEvidence,
) -> Evidence:
    runs = experiment.runs.exclude(trace_sha256="")
    evidence: Evidence = {
        "experiment": {"id": experiment.pk, "name": experiment.name},
        "offered_load": _offered_load(experiment),
        "trace_sha256": sorted(set(runs.values_list("trace_sha256", flat=True))),
        "corpus_sha256": sorted(set(runs.exclude(corpus_sha256="").values_list("corpus_sha256", flat=True))),
        "decision": {
            "outcome": decision.outcome,
            "chosen_cell": decision.chosen_cell,
            "rule": decision.rule,
            "analysed_at": decision.updated_at.isoformat(),
            "report_sha256": mf.content_sha256(decision.report or {}),
        },
        "failure_scenarios": failure_scenarios,
        "recovery": recovery,
    }
    # An isolate decision's pools, as the stored report (report_sha256 above) sized them.
    pools = (decision.report or {}).get("pools")
    if decision.outcome == Decision.Outcome.ISOLATE and isinstance(pools, Mapping):
        evidence["pools"] = cast(PoolSizing, dict(pools))
    return evidence


# Check 4 results an approver may override only with a typed reason.
UNPROVEN_RECOVERY = frozenset({"fail", "not rehearsed", "pending"})


def _recovery_evidence(
    decision: Decision, check4: Mapping[str, Any], *, chosen_cell: str, baseline: str, override: str
) -> RecoveryEvidence:
    """Check 4 as the manifest states it: the latest rehearsal's run and what it measured (or why
    there is none), and every attempt of the cell with its outcome and, for a repeat, its reason."""
    if chosen_cell == baseline:
        return {"check": "not needed", "reason": "B0 stays: there is no change to roll back"}
    out: RecoveryEvidence = {"check": check4.get("status"), "reason": check4.get("reason")}
    rehearsal = ((decision.report or {}).get("rehearsals") or {}).get(chosen_cell) or {}
    measures = rehearsal.get("measures") or {}
    if rehearsal:
        out["run"] = rehearsal.get("run")
    if rehearsal.get("attempts"):
        # Every attempt, not only the latest: a rehearsal repeated until it passed says so here.
        out["attempts_summary"] = str(rehearsal.get("summary") or "")
        out["attempts"] = [
            {
                "attempt": a["attempt"],
                "run": a["run"],
                "outcome": a["outcome"],
                "why": a["why"],
                "requeued_by_service": bool(a.get("requeued_by_service")),
                "time_to_recover_s": a.get("time_to_recover_s"),
                "requested_by": a.get("requested_by"),
                "repeat_reason": a.get("repeat_reason"),
                "queued_at": a.get("queued_at"),
                "finished_at": a.get("finished_at"),
            }
            for a in rehearsal["attempts"]
        ]
    if measures:
        out.update(
            {
                "standby": measures.get("standby"),
                "switch_at_s": measures.get("switch_at_s"),
                "time_to_recover_s": measures.get("time_to_recover_s"),
                "max_recovery_s": measures.get("max_recovery_s"),
                "surge": measures.get("surge"),
                "cut_streams": measures.get("cut"),
                "unaccounted": (measures.get("accounting") or {}).get("unaccounted"),
                # The deadline and thresholds the rehearsal exercised are the baseline record's.
                "exercised": {
                    "drain_deadline_seconds": round(
                        float(measures["cut_at_s"]) - float(measures["switch_at_s"]), 3
                    ),
                    "abort_thresholds": "baseline.abort_thresholds (each class's contract)",
                },
            }
        )
    if out["check"] == "not rehearsed":
        out["not_rehearsed"] = True
    if override and out["check"] in UNPROVEN_RECOVERY:
        out["override_reason"] = override
    return out


def scenario_evidence(
    decision: Decision, *, chosen_cell: str, baseline: str, override: str = ""
) -> ScenarioEvidence:
    """Check 3 for the cell being approved: did its failure scenarios run, and did each hold?

    ``check`` is ``pass`` (every scenario run of the cell held), ``fail`` (one did not) or
    ``not run`` (the cell has none); B0 staying needs none.
    """
    if chosen_cell == baseline:
        return {"check": "not needed", "reason": "B0 stays: no configuration change to stress"}
    listed = ((decision.checks or {}).get("failure_scenarios") or {}).get("runs") or []
    # A run that failed and was retried (a lost worker or host) is judged by its retry: where a
    # scenario point has a done run, the others of that point are left out.
    points: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in listed:
        if r.get("cell") == chosen_cell:
            points.setdefault((r["scenario"], r.get("mixture"), r.get("rate"), r.get("repeat")), []).append(r)
    runs = [
        r for group in points.values() for r in ([x for x in group if x.get("status") == "done"] or group)
    ]
    failed = sorted({r["scenario"] for r in runs if not r.get("held")})
    if not runs:
        out: ScenarioEvidence = {"check": "not run", "reason": f"no failure scenario ran for {chosen_cell}"}
    elif failed:
        out = {"check": "fail", "reason": f"{chosen_cell} did not hold under {', '.join(failed)}"}
    else:
        out = {"check": "pass", "reason": f"{chosen_cell} held under every scenario it ran"}
    out["runs"] = [
        {"scenario": r["scenario"], "run": r.get("run"), "held": bool(r.get("held"))} for r in runs
    ]
    if override and out["check"] != "pass":
        out["override_reason"] = override
    return out


# An approval's verdict -> the experiment's status after it.
VERDICT_STATUS = {
    Approval.Verdict.APPROVED: Experiment.Status.APPROVED,
    Approval.Verdict.REJECTED: Experiment.Status.REJECTED,
}


def _record_verdict(
    experiment: Experiment, approver: Any, *, verdict: str, chosen_cell: str, reason: str
) -> Approval:
    """The Approval row of a verdict (inside the caller's transaction, on the locked experiment;
    the caller then moves the experiment to ``VERDICT_STATUS[verdict]``)."""
    return Approval.objects.create(
        experiment=experiment,
        approver=approver,
        verdict=verdict,
        chosen_cell=chosen_cell,
        reason=reason.strip(),
    )


@transaction.atomic
def experiment_approve(
    *,
    experiment: Experiment,
    approver: Any,
    chosen_cell: str,
    reason: str,
    deployment_revision: str = "",
    route_target: str = "",
    recovery_override: str = "",
    scenarios_override: str = "",
) -> RollbackManifest:
    """Approve the decision's proposed cell or B0, and freeze the rollback manifest.

    Refuses non-approvers and the author (PermissionDenied), experiments not
    analysed, and any cell other than the proposal or B0 (ApprovalError).
    The approval, the manifest, the status change and the audit event are
    written together or not at all.
    """
    experiment = _locked(experiment)
    decision = _check(experiment, approver)
    if not reason.strip():
        raise ApprovalError("give a reason for the approval", field="reason")
    if not deployment_revision.strip():
        raise ApprovalError(
            "give the deployment revision B0 runs as now (a git sha, a Helm release): the rollback returns to it",
            field="deployment_revision",
        )
    if not route_target.strip():
        raise ApprovalError(
            "give where traffic goes (the service, route or pool the rollback switches)", field="route_target"
        )
    cells = {c.cell_id: c for c in experiment.cells.all()}
    b0 = next(c for c in cells.values() if c.role == ServerConfig.Role.BASELINE)
    allowed = {b0.cell_id, decision.chosen_cell or b0.cell_id}
    if chosen_cell not in allowed:
        raise ApprovalError(
            f"choose the decision's proposal or B0 ({', '.join(sorted(allowed))}), not {chosen_cell!r}"
        )
    check4 = dict((decision.checks or {}).get("recovery") or {})
    override = recovery_override.strip()
    unproven = check4.get("status") in UNPROVEN_RECOVERY or not check4.get("status")
    if chosen_cell != b0.cell_id and unproven and not override:
        raise ApprovalError(
            field="recovery_override",
            message=f"check 4 (recovery) is {check4.get('status') or 'not measured'}: {check4.get('reason', '')}. "
            f"To approve {chosen_cell} anyway, type why in the check 4 override reason",
        )
    check3_override = scenarios_override.strip()
    check3 = scenario_evidence(
        decision, chosen_cell=chosen_cell, baseline=b0.cell_id, override=check3_override
    )
    if check3["check"] in ("fail", "not run") and not check3_override:
        raise ApprovalError(
            f"check 3 (failure scenarios) is {check3['check']}: {check3['reason']}. To approve "
            f"{chosen_cell} anyway, type why in the check 3 override reason",
            field="scenarios_override",
        )
    now = timezone.now()
    baseline = _baseline_record(
        experiment, b0, deployment_revision=deployment_revision.strip(), route_target=route_target.strip()
    )
    candidate: ApprovedCandidate | None = None
    if chosen_cell != b0.cell_id:
        cand = _cell_record(experiment, cells[chosen_cell])
        candidate = {"cell_id": chosen_cell, "effective_args": cand["effective_args"]}
        if cells[chosen_cell].engine:
            candidate["engine"] = cells[chosen_cell].engine
    evidence = _evidence(
        experiment,
        decision,
        failure_scenarios=check3,
        recovery=_recovery_evidence(
            decision, check4, chosen_cell=chosen_cell, baseline=b0.cell_id, override=override
        ),
    )
    content = mf.build_manifest(
        baseline=baseline,
        candidate=candidate,
        evidence=evidence,
        approval={
            "verdict": Approval.Verdict.APPROVED,
            "approver": approver.get_username(),
            "chosen_cell": chosen_cell,
            "reason": reason.strip(),
            "at": now.isoformat(),
        },
    )
    approval = _record_verdict(
        experiment,
        approver,
        verdict=Approval.Verdict.APPROVED,
        chosen_cell=chosen_cell,
        reason=reason,
    )
    sha = mf.content_sha256(content)
    manifest = RollbackManifest.objects.create(
        experiment=experiment, approval=approval, content=content, sha256=sha, **mf.files(content, sha)
    )
    experiment_transition(
        experiment,
        VERDICT_STATUS[Approval.Verdict.APPROVED],
        reason=f"approved {chosen_cell} by {approver.get_username()}",
        actor=approver,
        action="experiment.approved",
        target=chosen_cell,
        detail={
            "reason": reason.strip(),
            "manifest_sha256": sha,
            "decision": decision.outcome,
            "check_3": check3["check"],
            **({"check_3_override": check3["override_reason"]} if "override_reason" in check3 else {}),
            "check_4": check4.get("status"),
            **({"check_4_override": override} if override and chosen_cell != b0.cell_id else {}),
        },
    )
    return manifest


@transaction.atomic
def experiment_reject(*, experiment: Experiment, approver: Any, reason: str) -> Approval:
    """Reject the analysed experiment: nothing changes in production, B0 stays."""
    experiment = _locked(experiment)
    decision = _check(experiment, approver)
    if not reason.strip():
        raise ApprovalError("give a reason for the rejection")
    b0 = experiment.cells.get(role=ServerConfig.Role.BASELINE)
    approval = _record_verdict(
        experiment,
        approver,
        verdict=Approval.Verdict.REJECTED,
        chosen_cell=b0.cell_id,
        reason=reason,
    )
    experiment_transition(
        experiment,
        VERDICT_STATUS[Approval.Verdict.REJECTED],
        reason=f"rejected by {approver.get_username()}",
        actor=approver,
        action="experiment.rejected",
        target=decision.chosen_cell or b0.cell_id,
        detail={"reason": reason.strip(), "decision": decision.outcome},
    )
    return approval


@transaction.atomic
def approval_revoke(*, experiment: Experiment, actor: Any, reason: str) -> Revocation:
    """Withdraw an approval: the manifest is superseded (its bytes and digest stay verifiable).

    Any approver may revoke, the author and the approver included: stopping a rollout
    never needs a second pair of eyes. Refused for a non-approver (PermissionDenied)
    and for an experiment that is not approved (ApprovalError); written with its audit
    event (before and after) or not at all.
    """
    if not has_role(actor, APPROVER):
        raise PermissionDenied("only approvers can revoke an approval")
    experiment = _locked(experiment)
    if experiment.status != Experiment.Status.APPROVED:
        raise ApprovalError(
            f"the experiment is {experiment.status}; only an approved experiment can be revoked"
        )
    reason = reason.strip()
    if not reason:
        raise ApprovalError("give a reason for the revocation")
    approval = Approval.objects.get(experiment=experiment)
    manifest = RollbackManifest.objects.filter(approval=approval).first()
    revocation = Revocation.objects.create(approval=approval, revoked_by=actor, reason=reason)
    experiment_transition(
        experiment,
        Experiment.Status.REVOKED,
        reason=f"approval of {approval.chosen_cell} revoked by {actor.get_username()}: {reason}"[:2000],
        actor=actor,
        action="experiment.revoked",
        target=approval.chosen_cell,
        detail={
            "reason": reason,
            "approved_by": approval.approver.get_username(),
            "manifest_sha256": manifest.sha256 if manifest else None,
            "manifest": "superseded",
        },
    )
    return revocation
