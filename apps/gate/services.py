"""The gate on the server: create the paired experiment from a gate request, and read its verdict.

``gate_create`` stores the trace window, builds the experiment (apps/gate/build.py),
and starts it, in one transaction: a bad trace line, a bad field or no live host
leaves nothing behind. ``gate_resource`` is the JSON a CI job or a rollout
controller reads (apps/gate/verdict.py decides it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from apps.audit.services import audit_record
from apps.experiments.models import Experiment
from apps.experiments.spec import FieldError, SpecError
from apps.gate.build import (
    MIN_REPEATS,
    MIN_REPEATS_MESSAGE,
    Baseline,
    GateInput,
    gate_spec,
    resolve_baseline,
    split_of,
    summarize,
    user_path,
)
from apps.gate.verdict import gate_verdict
from apps.gate.verdict_types import GateResource
from apps.lifecycle import selectors
from apps.lifecycle.creation import experiment_create
from apps.runs.models import Run
from clients.tailtune_gate import FORMATS as GATE_FORMATS  # one list for the client and the server


class GateUnavailable(Exception):
    """The gate cannot run here now (no live host): an infrastructure error, exit 3."""


def _store_window(request: GateInput, base: Baseline, data: bytes) -> Any:
    from apps.workloads.importers import check_size, parse_class_thresholds
    from apps.workloads.services import tokenizer_dir, trace_import, trace_store_bytes

    check_size(len(data), name="trace")
    if request.trace_format == "tailtune":
        return trace_store_bytes(data=data, label="gate window")
    try:
        thresholds = parse_class_thresholds(split_of(request, base))
    except ValueError as exc:
        raise SpecError([FieldError("classes", str(exc))]) from None
    model = base.model if isinstance(base.model, dict) else {}
    controls = base.controls if isinstance(base.controls, dict) else {}
    try:
        tok = tokenizer_dir(str(model.get("path") or ""))
    except Exception as exc:  # no tokenizer there: name the field
        raise SpecError([FieldError("model.path", str(exc)[:500])]) from None
    max_len = controls.get("max_model_len")
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 2:
        raise SpecError([FieldError("controls.max_model_len", "is required: a positive integer")])
    return trace_import(
        data=data,
        fmt=request.trace_format,
        tokenizer_dir=tok,
        tokenizer_revision=str(model.get("tokenizer_revision") or ""),
        thresholds=thresholds,
        max_model_len=max_len,
        busiest_s=request.busiest_s,
        warmup_s=float(base.workload["warmup_s"]),
        seed=int(base.workload["seed"]) if isinstance(base.workload["seed"], int) else 0,
        label=f"gate window ({request.trace_format})",
    )


def manifest_issued(manifest_text: str) -> None:
    """Refuse a manifest this service did not issue, or one whose approval was revoked.

    1. The digest (apps/gate/build.parse_manifest): the file is whole. Anyone can compute a
       matching digest for a manifest of their own, so this proves nothing about who wrote it.
    2. The lookup: the digest must be one of the manifests this server's approvals stored
       (apps/approvals RollbackManifest). Only those are "production as last approved".
    3. Superseded: a manifest whose approval was revoked is not what production should run.

    Each refusal names its check and the digest, so the CI log says exactly what failed.
    """
    from apps.approvals.models import RollbackManifest
    from apps.gate.build import parse_manifest

    sha = str(parse_manifest(manifest_text).get("sha256") or "")
    stored = (
        RollbackManifest.objects.filter(sha256=sha)
        .select_related("experiment", "approval__approver")
        .order_by("created_at", "pk")
        .first()
    )
    if stored is None:
        raise SpecError(
            [
                FieldError(
                    "baseline_manifest",
                    f"manifest sha256 {sha[:12]}… is not one this service issued: its digest matches "
                    "its content, but no approval here stored a manifest with that digest (download "
                    "it from the approved experiment's results page or "
                    "/api/v1/experiments/<id>/manifest.yaml)",
                )
            ]
        )
    revocation = stored.superseded_by
    if revocation is not None:
        approval = stored.approval
        raise SpecError(
            [
                FieldError(
                    "baseline_manifest",
                    f"manifest sha256 {sha[:12]}… (experiment {stored.experiment_id}, approved by "
                    f"{approval.approver.get_username()} on {approval.created_at:%Y-%m-%d %H:%M} UTC) "
                    f"was superseded: its approval was revoked on {revocation.created_at:%Y-%m-%d %H:%M} "
                    f"UTC by {revocation.revoked_by.get_username()} ({revocation.reason[:200]}); "
                    "give the manifest production runs now",
                )
            ]
        )


def _check_class_quality(base: Baseline) -> None:
    """The gate file's quality contracts, bounded as an experiment's are (a validator's schema
    within apps/experiments/schema_bounds.py): refused in the request, before any window is read.
    The analysis then runs them within the host's validator budget, as for any experiment."""
    from apps.experiments.quality_contract import check_class_quality

    errors = []
    for i, cls in enumerate(base.classes):
        if isinstance(cls, Mapping) and cls.get("quality") is not None:
            _, problems = check_class_quality(cls["quality"], f"spec.classes[{i}].quality")
            errors += [FieldError(path, message) for path, message in problems]
    if errors:
        raise SpecError(errors)


def gate_check(request: GateInput) -> Baseline:
    """What can be checked before the window is read: the format, the repeats, B0 (the gate
    file, or a manifest this service issued and nobody revoked) and the split into classes. Raises SpecError (the user's
    field paths); the API answers these in the request, before it stores the window."""
    from apps.experiments.model_roots import model_path_error
    from apps.workloads.importers import parse_class_thresholds

    if request.trace_format not in GATE_FORMATS:
        raise SpecError([FieldError("format", f"must be one of {', '.join(GATE_FORMATS)}")])
    if (
        not isinstance(request.repeats, int)
        or isinstance(request.repeats, bool)
        or request.repeats < MIN_REPEATS
    ):
        raise SpecError([FieldError("repeats", MIN_REPEATS_MESSAGE)])
    if request.manifest_text is not None:
        manifest_issued(request.manifest_text)
    try:
        base = resolve_baseline(request)
        # B0's model under the model roots, before anything reads it (the window's tokenizer).
        model = base.model if isinstance(base.model, dict) else {}
        outside = model_path_error(str(model.get("path") or ""))
        if outside is not None:
            raise SpecError([FieldError("model.path", outside)])
        _check_class_quality(base)
        if request.trace_format != "tailtune":
            try:
                parse_class_thresholds(split_of(request, base))
            except ValueError as exc:
                if isinstance(exc, SpecError):
                    raise
                raise SpecError([FieldError("classes", str(exc))]) from None
    except SpecError as exc:
        raise SpecError([FieldError(user_path(e.path), e.message) for e in exc.errors]) from None
    return base


GATE_CREATED = "gate.created"
GATE_VERDICT = "gate.verdict"


def _guards(manifest_text: str | None) -> dict[str, Any]:
    """What production the gate guards, as its B0 manifest names it: the manifest's digest, its
    route target and deployment revision (the history per route target reads them). A gate given
    no manifest guards no named route."""
    from apps.approvals.models import RollbackManifest
    from apps.gate.build import parse_manifest

    if manifest_text is None:
        return {"baseline_manifest_sha256": None, "route_target": "", "deployment_revision": ""}
    sha = str(parse_manifest(manifest_text).get("sha256") or "")
    stored = RollbackManifest.objects.filter(sha256=sha).order_by("created_at", "pk").first()
    deployment = ((stored.content or {}).get("baseline") or {}).get("deployment") or {} if stored else {}
    return {
        "baseline_manifest_sha256": sha,
        "baseline_experiment": stored.experiment_id if stored else None,
        "route_target": str(deployment.get("route_target") or ""),
        "deployment_revision": str(deployment.get("revision") or ""),
    }


def gate_verdict_record(*, experiment: Experiment) -> None:
    """Audit a gate experiment's verdict once it is analysed (``gate.verdict``): the history per
    route target shows it, and a verdict other than pass tells people (apps/notifications).
    Not a gate (no ``gate.created``): nothing."""
    from apps.audit.models import AuditEvent

    created = (
        AuditEvent.objects.filter(experiment=experiment, action=GATE_CREATED).order_by("at", "pk").first()
    )
    if created is None:
        return
    experiment = Experiment.objects.select_related("decision").get(pk=experiment.pk)
    verdict: dict[str, Any]
    try:
        verdict = dict(gate_resource(experiment=experiment))
    except ValueError as exc:  # several candidates, none named: not a gate's shape
        verdict = {"verdict": "inconclusive", "exit_code": None, "reasons": [str(exc)]}
    guards = {
        k: created.detail.get(k) for k in ("baseline_manifest_sha256", "route_target", "deployment_revision")
    }
    audit_record(
        action=GATE_VERDICT,
        experiment=experiment,
        target=str(guards.get("route_target") or ""),
        detail={
            "verdict": verdict["verdict"],
            "exit_code": verdict.get("exit_code"),
            "reasons": [str(r)[:300] for r in verdict.get("reasons", [])[:5]],
            **guards,
        },
    )


def gate_create(*, request: GateInput, trace_data: bytes, owner: Any) -> Experiment:
    """Store the window, create B0 vs the candidate on it, and start it; all or nothing.

    Raises SpecError (field paths as the gate's user named them: ``candidate_args.max_num_seqs``,
    ``spec.classes``, ``trace`` with the line) or GateUnavailable.
    """
    from apps.lifecycle.running import StartError, experiment_start
    from apps.workloads.services import trace_load

    base = gate_check(request)
    try:
        with transaction.atomic():
            try:
                stored = _store_window(request, base, trace_data)
            except (ValueError, OSError) as exc:
                if isinstance(exc, SpecError):
                    raise
                raise SpecError([FieldError("trace", str(exc)[:2000])]) from None
            window = trace_load(sha256=stored.sha256)
            summary = summarize(stored.sha256, window.meta, [r for r in window.requests if not r.warmup])
            spec = gate_spec(request, base, summary, when=timezone.now().strftime("%Y-%m-%d %H:%M:%S"))
            experiment = experiment_create(spec=spec, owner=owner)
            audit_record(
                action=GATE_CREATED, actor=owner, experiment=experiment, detail=_guards(request.manifest_text)
            )
            try:
                experiment_start(experiment=experiment, actor=owner)
            except StartError as exc:
                raise GateUnavailable(str(exc)) from None
    except SpecError as exc:
        raise SpecError([FieldError(user_path(e.path), e.message) for e in exc.errors]) from None
    return experiment


def experiment_url(experiment: Experiment, *, base_url: str | None = None) -> str:
    base = (base_url or getattr(settings, "PUBLIC_URL", "") or "").rstrip("/")
    return f"{base}{reverse('experiments:detail', args=[experiment.pk])}"


def gate_resource(
    *, experiment: Experiment, candidate: str | None = None, base_url: str | None = None
) -> GateResource:
    """The verdict resource: what ``GET /api/v1/gates/<id>`` answers and the gate command writes.

    Raises ValueError when the experiment has several candidates and none is named.
    """
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    report = decision.report if decision is not None and decision.report else None
    status = experiment.status
    if status == Experiment.Status.RUNNING:
        report = None  # a restarted experiment's earlier decision is not this run's answer
    verdict = gate_verdict(report, candidate=candidate, status=status, status_reason=experiment.status_reason)
    if verdict["verdict"] == "inconclusive":
        # Why each run that is not data was refused, in the run's own words.
        for cell, mix, rate, rep, run_status, reason in (
            experiment.runs.filter(status__in=["invalid", "failed", "cancelled"], kind=Run.Kind.SWEEP)
            .order_by("plan_position")
            .values_list("cell__cell_id", "mixture", "rate_name", "repeat", "status", "reason")[:20]
        ):
            verdict["reasons"].append(
                f"run {cell} {mix}/{rate}/{rep} {run_status}: {reason or 'no reason given'}"[:1000]
            )
    progress = selectors.experiment_progress(experiment=experiment)
    w = experiment.workload
    return {
        "gate": experiment.pk,
        "experiment": experiment.pk,
        "name": experiment.name,
        "url": experiment_url(experiment, base_url=base_url),
        "status": experiment.status,
        "traffic": f"trace {w.imported_trace_sha256[:12]}, {w.repeats} paired repeat(s)"
        if w.imported_trace_sha256
        else f"{', '.join(w.mixtures)} at {', '.join(w.rates)}, {w.repeats} repeat(s)",
        "trace_sha256": w.imported_trace_sha256 or None,
        "progress": {"total": progress.total, "finished": progress.finished, "by_status": progress.by_status},
        **verdict,
        "pass": verdict["verdict"] == "pass",
    }
