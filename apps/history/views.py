"""Across experiments: two compared side by side, and the history of a route target."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from apps.experiments.models import Experiment
from apps.experiments.views import require_reader
from apps.history import selectors, side_by_side, timeline
from config.params import BadValue, parse_id


def _experiment(raw: str | None, field: str) -> Experiment | None:
    if not raw:
        return None
    pk = parse_id(raw)
    if pk is None:
        raise BadValue(field, "is not an experiment id")
    return get_object_or_404(Experiment.objects.select_related("decision"), pk=pk)


def comparison(query: Any) -> dict[str, Any]:
    """What the page and the API show for ``?a=&b=&a_cell=&b_cell=``: the two sides, and the rows
    or the reasons they cannot be compared. BadValue for an id that is not one."""
    a, b = _experiment(query.get("a"), "a"), _experiment(query.get("b"), "b")
    out: dict[str, Any] = {"a": None, "b": None, "rows": [], "reasons": [], "comparable": False}
    if a is None or b is None:
        return out
    cells = (
        query.get("a_cell") or selectors.default_cell(a),
        query.get("b_cell") or selectors.default_cell(b),
    )
    sides: list[side_by_side.Side] = []
    for experiment, cell in ((a, cells[0]), (b, cells[1])):
        out["a" if not sides else "b"] = {"experiment": experiment.pk, "name": experiment.name, "cell": cell}
        try:
            sides.append(selectors.side_for(experiment, cell))
        except side_by_side.NotComparable as exc:
            out["reasons"] += exc.reasons
    if len(sides) == 2:
        try:
            out["rows"] = side_by_side.compare(*sides)
            out["comparable"] = True
        except side_by_side.NotComparable as exc:
            out["reasons"] += exc.reasons
    return out


def compare_page(request: HttpRequest) -> HttpResponse:
    require_reader(request)
    result = comparison(request.GET)
    recent = Experiment.objects.filter(decision__isnull=False).order_by("-created_at")[:50]
    return render(request, "history/compare.html", {**result, "recent": recent, "query": request.GET})


def history(query: Any) -> dict[str, Any]:
    route, deployment = (query.get("route") or "").strip(), (query.get("deployment") or "").strip()
    if len(route) > 200 or len(deployment) > 200:
        raise BadValue("route" if len(route) > 200 else "deployment", "is at most 200 characters")
    events = selectors.route_history(route_target=route, deployment=deployment) if route or deployment else []
    title = f"route target {route}" if route else f"deployment {deployment}"
    return {"route": route, "deployment": deployment, "events": events, "title": title}


def history_page(request: HttpRequest) -> HttpResponse:
    require_reader(request)
    found = history(request.GET)
    fig = timeline.chart(found["events"], found["title"]) if found["events"] else None
    return render(request, "history/route.html", {**found, "fig": fig, "routes": selectors.route_targets()})
