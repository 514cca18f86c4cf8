"""Experiment pages: list, create, the live experiment page, results.

Views stay thin: one access check, a form or a selector, one service call.

Over 500 lines on purpose: one thin view per page and action of an experiment (the list, the
create form with B0's capture and trace uploads, the page, its live partial and progress JSON,
the goodput search, start, rehearse, cancel, the spec, the results), each short; splitting them
would only scatter the URL table's targets.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_http_methods, require_POST

from apps.accounts.roles import APPROVER, has_role
from apps.analysis import charts, results_summary, stored_report
from apps.analysis.services import recovery_check_now
from apps.experiments.form_spec import attach_spec_errors, build_spec, spec_from_upload, validate_built
from apps.experiments.forms import CAPTURE_SECTION, CellFormSet, ClassFormSet, ExperimentForm
from apps.experiments.models import Experiment, RunsRefused, TraceUpload, runs_refusal
from apps.experiments.offers import offers_for
from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import MAX_SPEC_BYTES, SpecError, dump_spec
from apps.experiments.spec_capture import b0_origin
from apps.experiments.spec_types import NormalizedSpec
from apps.history.list_filters import PAGE_SIZE, FilterError, parse_list_filters, parse_page
from apps.history.selectors import experiments_filtered
from apps.lifecycle import running, selectors
from apps.lifecycle.calibration import GoodputRequestError, goodput_capacity_request
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.rehearsal_schedule import rehearsal_cost_s
from apps.lifecycle.trace_upload import trace_upload_queue
from apps.runs.engine_time import engine_time_summary
from apps.runs.models import Run
from apps.runs.scheduling import hosts_by_qualification
from apps.runs.selectors import offered_load
from apps.search.charts import trials_figure
from apps.search.selectors import search_report
from apps.workloads.importers import parse_class_thresholds
from config.bodylimits import upload_limits
from config.params import BadValue
from config.uploadhandlers import too_large_message


def require_reader(request: HttpRequest) -> None:
    if not selectors.can_read(request.user):
        raise PermissionDenied("you need the viewer, experimenter or approver role to see experiments")


def _experiment(request: HttpRequest, pk: int) -> Experiment:
    require_reader(request)
    return get_object_or_404(Experiment.objects.select_related("owner", "workload"), pk=pk)


# --- list ---------------------------------------------------------------------------


def experiment_list(request: HttpRequest) -> HttpResponse:
    """Filtered by the URL's query (apps/history/list_filters.py), so a reload keeps them; 25 a page."""
    require_reader(request)
    try:
        filters = parse_list_filters(request.GET)
        number = parse_page(request.GET.get("page"))
    except FilterError as exc:
        raise BadValue(exc.field, exc.message) from None
    page = Paginator(experiments_filtered(filters), PAGE_SIZE).get_page(number)
    return render(
        request,
        "experiments/list.html",
        {
            "experiments": page.object_list,
            "page": page,
            "filters": filters,
            "filter_query": filters.query(),
            "status": filters.status,
            "statuses": Experiment.Status.values,
            "can_create": selectors.can_create(request.user),
        },
    )


# --- create -------------------------------------------------------------------------


# The model the embedded default serves (make engine builds it).
DEFAULT_MODEL_PATH = ".engine/models/tiny-llama"


def _model_defaults(model_path: str) -> dict[str, str]:
    """A model path that exists under the model roots, with the revisions its directory records,
    as the form's defaults. A path outside the roots gets the page a missing one gets: nothing
    outside them is looked at (apps/experiments/model_roots.py)."""
    from apps.experiments.model_roots import model_path_error
    from apps.workloads.services import model_revisions, tokenizer_dir

    if model_path_error(model_path) is not None or not tokenizer_dir(model_path).is_dir():
        return {}
    return {"model_path": model_path, **model_revisions(model_path)}


@upload_limits(spec_file=MAX_SPEC_BYTES)  # a spec file is dropped as it arrives past the spec's limit
def experiment_new(request: HttpRequest) -> HttpResponse:
    """GET: the empty form. POST: preview (plan size) or create; nothing is saved until valid."""
    require_reader(request)
    if not selectors.can_create(request.user):
        raise PermissionDenied("only experimenters can create experiments")
    estimate = None
    if request.method != "POST":
        form = ExperimentForm(initial=_model_defaults(request.GET.get("model_path") or DEFAULT_MODEL_PATH))
        cells = CellFormSet(prefix="cells")
        classes = ClassFormSet(prefix="classes")
        return _render_new(request, form, cells, classes, estimate)

    if "capture" in request.POST:
        return _capture_b0(request)
    form = ExperimentForm(request.POST, request.FILES)
    cells = CellFormSet(request.POST, prefix="cells")
    classes = ClassFormSet(request.POST, prefix="classes")
    spec: NormalizedSpec | None = None
    form_ok = form.is_valid()
    # A file over the upload cap was dropped while it arrived (config/uploadhandlers.py).
    for field, limit in (getattr(request, "uploads_too_large", None) or {}).items():
        if field in form.fields:
            form.add_error(field, too_large_message(limit))
            form_ok = False
    cells_ok = cells.is_valid()
    classes_ok = classes.is_valid()
    if form_ok and (form.cleaned_data.get("spec_file") or form.cleaned_data.get("spec_text")):
        try:
            spec = spec_from_upload(form)
        except SpecError as exc:
            for message in dict.fromkeys(f"{e.path}: {e.message}" for e in exc.errors):
                form.add_error("spec_file", message)
    elif form_ok and cells_ok and classes_ok:
        build = build_spec(form, cells, classes, owner=request.user.get_username())
        try:
            spec = validate_built(build)
        except SpecError as exc:
            attach_spec_errors(exc, build, form, cells, classes)
    if spec is not None:
        estimate = selectors.plan_estimate(spec)
        if "create" in request.POST:
            upload = form.cleaned_data.get("trace_file")
            try:
                if upload:
                    # Stored now, imported by a worker: the page says "importing…" until it is done.
                    queued = trace_upload_queue(
                        spec=spec,
                        owner=request.user,
                        upload=upload,
                        trace_format=form.cleaned_data.get("trace_format") or "azure",
                        thresholds=parse_class_thresholds(
                            form.cleaned_data.get("trace_classes") or "short:1024,long"
                        ),
                        busiest_s=form.cleaned_data.get("trace_busiest_s"),
                    )
                    return redirect("experiments:upload", pk=queued.pk)
                experiment = experiment_create(spec=spec, owner=request.user)
            except SpecError as exc:
                field = "trace_file" if upload else "spec_file"
                for e in exc.errors:
                    form.add_error(field, f"{e.path}: {e.message}")
            except ValueError as exc:  # the class thresholds of the trace
                form.add_error("trace_classes", str(exc))
            else:
                messages.success(
                    request, f"Created {experiment.name}: {estimate.runs} runs planned. Start it when ready."
                )
                return redirect("experiments:detail", pk=experiment.pk)
            return _render_new(request, form, cells, classes, estimate, status=400, spec=spec)
    return _render_new(
        request, form, cells, classes, estimate, status=200 if spec is not None else 400, spec=spec
    )


def _capture_b0(request: HttpRequest) -> HttpResponse:
    """The page's "Capture B0": B0 read from the chosen source (apps/approvals/capture_sources.py) and put
    into the form, or into the uploaded spec the page holds, for review; nothing is saved. An
    error is shown beside the capture's field at fault (400)."""
    from apps.approvals.capture_sources import baseline_capture
    from apps.experiments.form_capture import ERROR_FIELDS, captured_form_data, captured_spec_text

    form = ExperimentForm(request.POST, request.FILES)
    cells = CellFormSet(request.POST, prefix="cells")
    classes = ClassFormSet(request.POST, prefix="classes")
    form.is_valid()  # the capture fields' own checks: a server name the operator did not give, lengths
    if not request.POST.get("capture_source"):
        form.add_error("capture_source", "choose where to capture B0 from")
    elif not any(field in form.errors for field in ERROR_FIELDS.values()):
        try:
            captured = baseline_capture(
                source=request.POST.get("capture_source", ""),
                text=request.POST.get("capture_text", ""),
                server=request.POST.get("capture_server", ""),
                experiment=request.POST.get("capture_experiment", ""),
                container=request.POST.get("capture_container", ""),
            )
            data, notes = captured_form_data(request.POST, captured)
            upload = form.cleaned_data.get("spec_file")
            spec_text = (
                upload.read().decode("utf-8", "replace") if upload else form.cleaned_data.get("spec_text")
            )
            if spec_text:  # the uploaded spec is what Create uses: its B0 is replaced
                data["spec_text"], more = captured_spec_text(spec_text, captured)
                notes += more
        except SpecError as exc:
            for e in exc.errors:
                form.add_error(ERROR_FIELDS.get(e.path, "capture_source"), e.message)
        else:
            messages.success(
                request, f"{b0_origin({'capture': captured.capture})}: review it, then Preview or Create."
            )
            return _render_new(request, ExperimentForm(data), cells, classes, None, capture_notes=notes)
    return _render_new(request, form, cells, classes, None, status=400)


def upload_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A trace upload being imported: "importing…" (the page refreshes itself), its errors with
    their lines, or, once imported, the experiment it created."""
    require_reader(request)
    # A trace or gate window uploaded through the API is the API's resource.
    uploads = TraceUpload.objects.select_related("owner", "experiment").filter(
        kind=TraceUpload.Kind.EXPERIMENT
    )
    upload = get_object_or_404(uploads, pk=pk)
    if upload.owner_id != request.user.pk and not request.user.is_staff:
        raise PermissionDenied("only the author of an upload can follow its import")
    if upload.status == TraceUpload.Status.DONE and upload.experiment is not None:
        messages.success(request, f"Imported {upload.file_name} and created {upload.experiment.name}.")
        return redirect("experiments:detail", pk=upload.experiment.pk)
    status = 400 if upload.status == TraceUpload.Status.FAILED else 200
    return render(request, "experiments/upload.html", {"upload": upload}, status=status)


def _render_new(
    request: HttpRequest,
    form: ExperimentForm,
    cells: Any,
    classes: Any,
    estimate: selectors.PlanEstimate | None,
    status: int = 200,
    spec: NormalizedSpec | None = None,
    capture_notes: list[str] | None = None,
) -> HttpResponse:
    return render(
        request,
        "experiments/new.html",
        # The switch and router names a spec may pick (never the commands or URLs behind them):
        # those the hosts able to run the previewed spec offer, else those of every enabled host.
        {
            "form": form,
            "cells": cells,
            "classes": classes,
            "estimate": estimate,
            "offers": offers_for(max_model_len=spec["controls"]["max_model_len"] if spec else None),
            # What a "Capture B0" could not see or left out (apps/experiments/baseline_capture.py).
            "capture_notes": capture_notes or [],
            "capture_section": CAPTURE_SECTION,
        },
        status=status,
    )


# --- the experiment page ----------------------------------------------------------------


RUNS_PAGE = 200


def _filters(request: HttpRequest) -> dict[str, str]:
    return {k: request.GET.get(k, "") for k in ("cell", "mixture", "rate", "status") if request.GET.get(k)}


def _live_context(request: HttpRequest, experiment: Experiment) -> dict[str, Any]:
    progress = selectors.experiment_progress(experiment=experiment)
    current = []
    for run in selectors.current_runs(experiment=experiment):
        current.append(
            {
                "run": run,
                "ttft": selectors.live_ttft(run=run),
                "gauges": selectors.latest_gauges(run=run),
                "log": selectors.log_tail(run),
                "percent_sent": (100.0 * run.requests_sent / run.requests_planned)
                if run.requests_planned
                else None,
            }
        )
    filters = _filters(request)
    # A plan can hold thousands of runs: one page of them at a time, the page kept while polling.
    page = Paginator(selectors.run_rows(experiment=experiment, filters=filters), RUNS_PAGE).get_page(
        request.GET.get("page")
    )
    query = {**filters, **({"page": str(page.number)} if page.number > 1 else {})}
    # A search experiment's trials (#36), refreshed with the rest while it runs.
    search = search_report(experiment_id=experiment.pk, spec=experiment.spec or {})
    return {
        "search": search,
        "search_figure": trials_figure(search, lambda run_id: reverse("runs:detail", args=[run_id]))
        if search
        else None,
        "experiment": experiment,
        "progress": progress,
        "eta": selectors.human_duration(progress.eta_s),
        "current": current,
        "runs": page.object_list,
        "runs_page": page,
        "page_query": urlencode(filters),
        "filters": filters,
        # Polled for as long as the experiment runs: after its last run, until the analysis lands.
        "live": experiment.status == Experiment.Status.RUNNING,
        # A poll that finds the experiment no longer running has the page reload itself, so the
        # badge, the buttons and the decision above the partial are the new state's.
        "reload": request.headers.get("X-Requested-With") == "fetch"
        and experiment.status != Experiment.Status.RUNNING,
        "live_url": reverse("experiments:live", args=[experiment.pk])
        + (f"?{urlencode(query)}" if query else ""),
        "can_operate": selectors.can_operate(request.user, experiment),
    }


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment(request, pk)
    context = _live_context(request, experiment)
    context.update(
        {
            "cells": list(experiment.cells.all()),
            "classes": list(experiment.classes.all()),
            "decision": selectors.decision_summary(experiment=experiment),
            "approve_refusal": selectors.approve_refusal(request.user, experiment),
            "has_manifest": hasattr(experiment, "manifest"),
            "startable": experiment.status in (Experiment.Status.PLANNED, Experiment.Status.CANCELLED),
            "cancellable": experiment.status == Experiment.Status.RUNNING,
            "load": offered_load(experiment=experiment),
            "mixtures": sorted(experiment.workload.mixtures),
            "goodput_cost": selectors.goodput_cost(experiment=experiment),
            # Why no goodput search can be queued now (None: it can): the rule for decided experiments.
            "goodput_refusal": runs_refusal(experiment.status, Run.Kind.CALIBRATION),
            "hosts": hosts_by_qualification(experiment),
            "engine_time": engine_time_summary(experiment=experiment),
        }
    )
    return render(request, "experiments/detail.html", context)


@require_POST
def experiment_goodput(request: HttpRequest, pk: int) -> HttpResponse:
    """Queue one cell's goodput-capacity search, or with ``request_class`` its capacity for that
    class alone (costs engine time; the author only)."""
    experiment = _experiment(request, pk)
    if not selectors.can_operate(request.user, experiment):
        raise PermissionDenied("only the experiment's author can spend engine time on it")
    cell, mixture = request.POST.get("cell", ""), request.POST.get("mixture", "")
    request_class = request.POST.get("request_class", "")
    try:
        host = goodput_capacity_request(
            experiment=experiment,
            cell_id=cell,
            mixture=mixture,
            actor=request.user,
            request_class=request_class,
        )
    except (GoodputRequestError, RunsRefused) as exc:
        refused = f"Capacity of {cell} for {request_class} alone" if request_class else "Goodput capacity"
        messages.error(request, f"{refused} not queued: {exc}")
    else:
        what = (
            f"Capacity of {cell} for {request_class} alone"
            if request_class
            else f"Goodput capacity of {cell} on {mixture}"
        )
        messages.success(request, f"{what} queued on {host}.")
    return redirect(reverse("experiments:detail", args=[experiment.pk]) + "#offered-load")


def experiment_live(request: HttpRequest, pk: int) -> HttpResponse:
    """The live partial: progress, the current runs and the run table (polled while running)."""
    experiment = _experiment(request, pk)
    return render(request, "experiments/_live.html", _live_context(request, experiment))


def experiment_progress_json(request: HttpRequest, pk: int) -> JsonResponse:
    """Progress as JSON for scripts and dashboards: read from the database, never from a worker."""
    experiment = _experiment(request, pk)
    progress = selectors.experiment_progress(experiment=experiment)
    runs = experiment.runs.select_related("cell", "host").order_by("plan_position", "id")
    return JsonResponse(
        {
            "experiment": experiment.pk,
            "status": experiment.status,
            "status_reason": experiment.status_reason,
            "runs_total": progress.total,
            "runs_finished": progress.finished,
            "runs_by_status": progress.by_status,
            "eta_s": progress.eta_s,
            "eta_basis": progress.eta_basis,
            "active_runs": [
                {
                    "run_id": str(r.run_id),
                    "cell": r.cell.cell_id,
                    "mixture": r.mixture,
                    "rate": r.rate_name,
                    "repeat": r.repeat,
                    "scenario": r.scenario_label,
                    "host": r.host.name if r.host else None,
                    "phase": r.status,
                    "requests_sent": r.requests_sent,
                    "requests_planned": r.requests_planned,
                    "elapsed_s": (timezone.now() - r.started_at).total_seconds() if r.started_at else None,
                }
                for r in runs.filter(status__in=sorted(Run.ACTIVE))
            ],
        }
    )


@require_POST
def experiment_start(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment(request, pk)
    if not selectors.can_operate(request.user, experiment):
        raise PermissionDenied("only the experiment's author can start it")
    try:
        n = running.experiment_start(experiment=experiment, actor=request.user)
    except ValueError as exc:  # StartError: not startable, or no host alive
        messages.error(request, f"Not started: {exc}")
    else:
        messages.success(request, f"Started: {n if n is not None else 'the'} runs queued.")
    return redirect("experiments:detail", pk=experiment.pk)


@require_http_methods(["GET", "POST"])
def experiment_rehearse(request: HttpRequest, pk: int) -> HttpResponse:
    """Rehearse the rollback of one candidate to B0 now (check 4); its cost is shown beside the button.

    GET shows the form with each candidate's attempts so far; POST queues one. A cell rehearsed
    before needs a reason (400, naming the field, without one); an experiment that does not
    await approval or is rehearsing already answers 409. Nothing is saved on either.
    """
    from apps.lifecycle.rehearsal_schedule import RehearsalError, rehearsal_start

    experiment = _experiment(request, pk)
    if not selectors.can_operate(request.user, experiment):
        raise PermissionDenied("only the experiment's author can start a rehearsal")
    errors: dict[str, str] = {}
    status = 200
    if request.method == "POST":
        try:
            run = rehearsal_start(
                experiment=experiment,
                cell_id=request.POST.get("cell", ""),
                actor=request.user,
                reason=request.POST.get("reason", ""),
            )
        except RehearsalError as exc:
            errors[exc.field or "state"] = str(exc)
            status = 400 if exc.field else 409
        else:
            messages.success(
                request,
                f"Rehearsing the rollback of {run.cell.cell_id} to B0: the results update when it ends.",
            )
            return redirect("experiments:detail", pk=experiment.pk)
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    rehearsals = ((decision.report if decision else None) or {}).get("rehearsals") or {}
    attempts = {
        row["cell__cell_id"]: row["n"]
        for row in experiment.runs.filter(kind=Run.Kind.REHEARSAL)
        .values("cell__cell_id")
        .annotate(n=Count("id"))
    }
    cells = [
        {
            "cell_id": c.cell_id,
            "attempts": attempts.get(c.cell_id, 0),
            "summary": (rehearsals.get(c.cell_id) or {}).get("summary"),
        }
        for c in experiment.cells.exclude(role="baseline")
    ]
    context = {
        "experiment": experiment,
        "cells": cells,
        "chosen": request.POST.get("cell") or (decision.chosen_cell if decision else ""),
        "reason": request.POST.get("reason", ""),
        "errors": errors,
        "rehearsal_cost_s": rehearsal_cost_s(experiment),
    }
    return render(request, "experiments/rehearse.html", context, status=status)


@require_POST
def experiment_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment(request, pk)
    if not selectors.can_operate(request.user, experiment):
        raise PermissionDenied("only the experiment's author can cancel it")
    if experiment.status != Experiment.Status.RUNNING:
        messages.error(request, f"Nothing to cancel: the experiment is {experiment.status}.")
        return redirect("experiments:detail", pk=experiment.pk)
    running.experiment_cancel(experiment=experiment, actor=request.user)
    experiment.refresh_from_db()
    if experiment.status != Experiment.Status.CANCELLED:  # it moved on meanwhile (analysed)
        messages.error(request, f"Nothing to cancel: the experiment is {experiment.status}.")
        return redirect("experiments:detail", pk=experiment.pk)
    messages.success(request, "Cancelled: the current run stops within seconds; queued runs were dequeued.")
    return redirect("experiments:detail", pk=experiment.pk)


def experiment_spec(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment(request, pk)
    response = HttpResponse(dump_spec(experiment_to_spec(experiment=experiment)), content_type="text/yaml")
    response["Content-Disposition"] = f'attachment; filename="experiment-{experiment.pk}-spec.yaml"'
    return response


# --- results ---------------------------------------------------------------------------


def _revocation(experiment: Experiment) -> Any:
    from apps.approvals.models import Revocation

    return Revocation.objects.filter(approval__experiment=experiment).select_related("revoked_by").first()


# Compressed (GZipMiddleware on this view only): the page carries every chart's plotly figure,
# several hundred KiB of JSON that gzip shrinks about tenfold. BREACH needs a secret that stays
# the same across responses and attacker-chosen text reflected beside it: the page's only secret
# is the CSRF token, which Django masks afresh in every response, the middleware pads the gzip
# header randomly, and the page reflects no request input (the ``mixture``/``rate`` choice is
# matched against the report's own points, an unknown one falls back to the last).
@gzip_page
def experiment_results(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment(request, pk)
    # The report read once per process and row version, parsed anew per load (stored_report.py).
    decision = stored_report.decision_of(experiment.pk)
    progress = selectors.experiment_progress(experiment=experiment)
    context: dict[str, Any] = {
        "experiment": experiment,
        "decision": decision,
        "progress": progress,
        "load": offered_load(experiment=experiment),
        "can_revoke": experiment.status == Experiment.Status.APPROVED and has_role(request.user, APPROVER),
        "revocation": _revocation(experiment),
        # Where B0 came from: its capture, or "B0 typed by hand" (apps/experiments/spec_capture.py).
        "b0_origin": b0_origin((experiment.spec or {}).get("baseline")),
        "b0_captured": bool(((experiment.spec or {}).get("baseline") or {}).get("capture")),
    }
    report = stored_report.report_of(decision) if decision is not None else {}
    if decision is None or not report:
        context["partial"] = selectors.partial_results(experiment=experiment)
        return render(request, "experiments/results.html", context)
    runs_url = reverse("experiments:detail", args=[experiment.pk])

    def url_for_cell(*, cell: str, mixture: str, rate: str) -> str:
        return f"{runs_url}?{urlencode({'cell': cell, 'mixture': mixture, 'rate': rate})}#runs"

    def url_for_run(key: str) -> str:
        return reverse("runs:detail", args=[key])

    # Every figure and table comes from the stored report (apps/analysis/results_charts.py).
    chosen = (request.GET.get("mixture", ""), request.GET.get("rate", ""))
    context.update(
        charts.results_figures(report, chosen=chosen, url_for_cell=url_for_cell, url_for_run=url_for_run)
    )
    context.update(
        {
            "rehearsal_cost_s": rehearsal_cost_s(experiment),
            # Check 4 recomputed from its inputs now (a manifest written at approval, a rehearsal
            # that ended): the stored report is what the approver saw and stays as it was.
            "checks": {
                **report.get("checks", {}),
                "recovery": recovery_check_now(experiment=experiment, report=report),
            },
            "approve_refusal": selectors.approve_refusal(request.user, experiment),
            # The page's top in plain words: decision, reasons, the per-class chart, findings.
            "top": results_summary.summary(report, outcome=decision.outcome, chosen=decision.chosen_cell),
        }
    )
    return render(request, "experiments/results.html", context)
