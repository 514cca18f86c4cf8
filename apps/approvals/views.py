"""Approve, download the rollback manifest, read the audit log."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from apps.approvals.bundle import Bundle, bundle_download
from apps.approvals.models import RollbackManifest
from apps.approvals.services import (
    ApprovalError,
    approval_revoke,
    experiment_approve,
    experiment_reject,
    scenario_evidence,
)
from apps.audit.models import AuditEvent
from apps.experiments.models import Experiment
from apps.experiments.views import require_reader
from apps.lifecycle import selectors
from config.params import BadValue, parse_id

AUDIT_PAGE = 100


class ApproveForm(forms.Form):
    verdict = forms.ChoiceField(
        choices=[("approve", "Approve"), ("reject", "Reject")], widget=forms.HiddenInput
    )
    chosen_cell = forms.ChoiceField(widget=forms.RadioSelect, required=False, label="Configuration to deploy")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), label="Reason")
    # Required to approve (the service says so, on the field), not to reject.
    deployment_revision = forms.CharField(
        required=False,
        max_length=200,
        help_text="Required to approve: the deployment revision B0 runs as now (a git sha, a Helm release); "
        "the rollback returns to it.",
    )
    route_target = forms.CharField(
        required=False,
        max_length=200,
        help_text="Required to approve: where traffic goes (service, route or pool name).",
    )
    recovery_override = forms.CharField(
        required=False,
        max_length=2000,
        label="Check 4 override reason",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Required to approve a candidate whose rollback rehearsal failed, is pending or was "
        "not rehearsed; it goes into the audit log and the manifest.",
    )

    scenarios_override = forms.CharField(
        required=False,
        max_length=2000,
        label="Check 3 override reason",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Required to approve a candidate whose failure scenarios did not run or did not all "
        "hold; it goes into the audit log and the manifest.",
    )

    def __init__(self, *args, choices: list[tuple[str, str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["chosen_cell"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices


def _args_text(args: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(args.items())) or "vLLM defaults"


def _choices(experiment: Experiment, proposed: str) -> list[tuple[str, str]]:
    b0 = experiment.cells.get(role="baseline")
    out = []
    if proposed and proposed != b0.cell_id:
        cell = experiment.cells.get(cell_id=proposed)
        out.append((proposed, f"{proposed} (the decision's proposal): {_args_text(cell.args)}"))
    out.append((b0.cell_id, f"{b0.cell_id} (keep the baseline): {_args_text(b0.args)}"))
    return out


def experiment_approve_page(request: HttpRequest, pk: int) -> HttpResponse:
    require_reader(request)
    experiment = get_object_or_404(Experiment.objects.select_related("owner"), pk=pk)
    refusal = selectors.approve_refusal(request.user, experiment)
    if refusal is not None:
        raise PermissionDenied(refusal)
    decision = experiment.decision
    choices = _choices(experiment, decision.chosen_cell)
    if request.method == "POST":
        form = ApproveForm(request.POST, choices=choices)
        if form.is_valid():
            data = form.cleaned_data
            try:
                if data["verdict"] == "approve":
                    if not data.get("chosen_cell"):
                        raise ApprovalError("choose the configuration to deploy")
                    manifest = experiment_approve(
                        experiment=experiment,
                        approver=request.user,
                        chosen_cell=data["chosen_cell"],
                        reason=data["reason"],
                        deployment_revision=data["deployment_revision"],
                        route_target=data["route_target"],
                        recovery_override=data["recovery_override"],
                        scenarios_override=data["scenarios_override"],
                    )
                    messages.success(
                        request,
                        f"Approved {data['chosen_cell']}. Rollback manifest sha256 {manifest.sha256[:16]}…",
                    )
                else:
                    experiment_reject(experiment=experiment, approver=request.user, reason=data["reason"])
                    messages.success(request, "Rejected: B0 stays in place.")
                return redirect("experiments:detail", pk=experiment.pk)
            except ApprovalError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
    else:
        form = ApproveForm(initial={"chosen_cell": choices[0][0], "verdict": "approve"}, choices=choices)
    return render(
        request,
        "approvals/approve.html",
        {
            "experiment": experiment,
            "decision": decision,
            "form": form,
            "check4": (decision.checks or {}).get("recovery") or {},
            # Every rehearsal attempt of the proposal, as the stored report lists them.
            "attempts": (
                ((decision.report or {}).get("rehearsals") or {}).get(decision.chosen_cell) or {}
            ).get("attempts")
            or [],
            "check3": scenario_evidence(
                decision,
                chosen_cell=decision.chosen_cell or "",
                baseline=experiment.cells.get(role="baseline").cell_id,
            ),
        },
        status=200 if request.method != "POST" else 400,
    )


class RevokeForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), label="Why revoke", max_length=2000)


def approval_revoke_page(request: HttpRequest, pk: int) -> HttpResponse:
    """POST only: an approver withdraws the approval; the manifest is marked superseded."""
    require_reader(request)
    experiment = get_object_or_404(Experiment, pk=pk)
    if request.method != "POST":
        return redirect("experiments:results", pk=pk)
    form = RevokeForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a reason for the revocation (at most 2000 characters).")
        return redirect("experiments:results", pk=pk)
    try:
        approval_revoke(experiment=experiment, actor=request.user, reason=form.cleaned_data["reason"])
    except ApprovalError as exc:
        messages.error(request, str(exc))
        return redirect("experiments:results", pk=pk)
    messages.success(request, "Approval revoked: the rollback manifest is superseded.")
    return redirect("experiments:results", pk=pk)


def manifest_download(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    require_reader(request)
    if fmt not in ("yaml", "json"):
        raise Http404("the manifest comes as .yaml or .json")
    manifest = get_object_or_404(RollbackManifest, experiment_id=pk)
    response = manifest_response(manifest, fmt)
    response["Content-Disposition"] = f'attachment; filename="rollback-manifest-{pk}.{fmt}"'
    return response


def bundle_response(bundle: Bundle) -> HttpResponse:
    """The review bundle as a download, its sha256 in a header (the page's link and the API)."""
    response = HttpResponse(bundle.body, content_type="text/html; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{bundle.filename}"'
    response["X-Bundle-Sha256"] = bundle.sha256
    return response


def review_bundle(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the review bundle of an analysed experiment (any reader; the download is audited)."""
    require_reader(request)
    experiment = get_object_or_404(Experiment, pk=pk)
    try:
        bundle = bundle_download(experiment=experiment, actor=request.user)
    except ValueError as exc:
        raise Http404(str(exc)) from None
    return bundle_response(bundle)


def manifest_response(manifest: RollbackManifest, fmt: str) -> HttpResponse:
    """The stored bytes of one manifest file (the page's download and the API's)."""
    body, file_sha = manifest.file(fmt)
    response = HttpResponse(body, content_type="application/yaml" if fmt == "yaml" else "application/json")
    # What `sha256sum` of the download prints; the content digest inside the file is apart.
    response["X-Manifest-File-Sha256"] = file_sha
    response["X-Manifest-Sha256"] = manifest.sha256
    revocation = manifest.superseded_by
    response["X-Manifest-Status"] = "superseded" if revocation else "current"
    if revocation is not None:
        response["X-Manifest-Superseded-At"] = revocation.created_at.isoformat()
    return response


def _audit_page(request: HttpRequest, events, experiment: Experiment | None) -> HttpResponse:
    action = request.GET.get("action", "").strip()
    actor = request.GET.get("actor", "").strip()
    exp = request.GET.get("experiment", "").strip()
    if action:
        events = events.filter(action__startswith=action)
    if actor:
        events = events.filter(actor__username=actor)
    if exp and experiment is None:
        experiment_id = parse_id(exp)
        if experiment_id is None:
            raise BadValue("experiment", "give an experiment's number (the digits 0-9, as in its URL)")
        events = events.filter(experiment_id=experiment_id)
    page = Paginator(events.select_related("actor", "experiment"), AUDIT_PAGE).get_page(
        request.GET.get("page")
    )
    actions = AuditEvent.objects.order_by("action").values_list("action", flat=True).distinct()
    return render(
        request,
        "approvals/audit.html",
        {
            "experiment": experiment,
            "page": page,
            "filters": {"action": action, "actor": actor, "experiment": exp},
            "actions": list(actions),
            "actors": list(get_user_model().objects.order_by("username").values_list("username", flat=True)),
        },
    )


def audit_log(request: HttpRequest) -> HttpResponse:
    require_reader(request)
    return _audit_page(request, AuditEvent.objects.all(), None)


def experiment_audit(request: HttpRequest, pk: int) -> HttpResponse:
    require_reader(request)
    experiment = get_object_or_404(Experiment, pk=pk)
    return _audit_page(request, AuditEvent.objects.filter(experiment=experiment), experiment)
