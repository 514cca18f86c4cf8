"""The run page: one run's request-level distribution, its effective args, hashes, hardware and log."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from apps.analysis import charts
from apps.experiments.models import RequestClass
from apps.experiments.views import require_reader
from apps.lifecycle import selectors
from apps.runs.models import Run
from apps.runs.selectors import run_record


def _report_entry(run: Run) -> dict[str, Any] | None:
    """This run's per-class metrics from the stored report, if the experiment was analysed."""
    decision = getattr(run.experiment, "decision", None) if hasattr(run.experiment, "decision") else None
    if decision is None:
        return None
    key = str(run.run_id)
    return next((r for r in (decision.report or {}).get("runs", []) if str(r.get("key")) == key), None)


# The run page's per-request histograms: metric, title, the class contract drawn on it.
LATENCY_CHARTS = (
    ("ttft", "Time to first token, per request", "ttft_p99_ms"),
    ("e2e", "End-to-end latency, per request", "e2e_p99_ms"),
)


def _latency_chart(
    run: Run, classes: list[RequestClass], metric: str, title: str, limit: str
) -> dict[str, Any] | None:
    """One metric's histogram over the run's requests, with each class's contract; None when
    no request has that metric."""
    histogram = selectors.latency_histogram(run=run, metric=metric)
    if not histogram["series"]:
        return None
    return charts.request_histogram(
        histogram=histogram,
        classes=[c.name for c in classes],
        title=title,
        contracts={c.name: getattr(c, limit) for c in classes},
    )


def run_detail(request: HttpRequest, run_id: Any) -> HttpResponse:
    require_reader(request)
    run = get_object_or_404(
        Run.objects.select_related("experiment", "experiment__owner", "cell", "host", "trace"), run_id=run_id
    )
    experiment = run.experiment
    classes = list(experiment.classes.all())
    names = [c.name for c in classes]
    gauges = selectors.gauge_series(run=run)
    entry = _report_entry(run)
    context = {
        "run": run,
        "experiment": experiment,
        "classes": classes,
        "class_colours": charts.class_colours(names),
        "outcomes": selectors.record_outcomes(run=run),
        **{
            f"{metric}_chart": _latency_chart(run, classes, metric, title, limit)
            for metric, title, limit in LATENCY_CHARTS
        },
        "gauge_chart": charts.run_gauges(series=gauges) if gauges else None,
        "report_entry": entry,
        "report_classes": sorted(
            (entry or {}).get("classes", {}).items(),
            key=lambda kv: names.index(kv[0]) if kv[0] in names else 99,
        ),
        "requested_args": run.cell.args,
        "log": run.log_tail,
    }
    return render(request, "runs/detail.html", context)


def run_export(request: HttpRequest, run_id: Any) -> HttpResponse:
    """The run record as a JSON download (docs/SPEC.md "The run record"); its request records
    are at /api/v1/runs/<run_id>/records."""
    require_reader(request)
    run = get_object_or_404(Run.objects.select_related("cell", "host", "retry_of"), run_id=run_id)
    response = JsonResponse(run_record(run), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="run-{run.run_id}.json"'
    return response
