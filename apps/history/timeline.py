"""The history of one route target (or deployment): what was live after each approval,
revocation and gate verdict, and its chart. Pure.

1. The steps come in time order (selectors.route_history reads them).
2. An approval makes its chosen cell live; a revocation takes that approval away, so the
   approval before it is live again (or nothing known). A gate verdict changes nothing live: it
   measured the live config (its B0) against a candidate, and both are shown at its time.
3. Each class's primary metric (family.primary_metrics: declared, else TTFT p99 for the short
   class and E2E p99 for the long one) is read per config as the worst value over the
   experiment's points (mixture, rate): one number per class, the tail the contract guards.
4. The chart draws each class's live value as a step line (a regression shows as a step up),
   marks each event on it, and at a gate the live config as the gate measured it (on the gate's
   own window: an open diamond, not joined to the line, whose values came from other traffic)
   and the gate's candidate (a cross, green when it passed, red otherwise).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.analysis.chart_style import FAIL_COLOUR, PASS_COLOUR, base_layout, class_colours
from apps.analysis.family import primary_metrics
from apps.history.pooled import value


@dataclass(frozen=True)
class Step:
    at: dt.datetime
    kind: str  # approval, revocation, gate
    experiment_id: int
    experiment_name: str
    cell: str
    who: str
    text: str  # the reason, or the gate's verdict
    approval_id: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)  # per class, of the config measured
    candidate_metrics: Mapping[str, float] = field(default_factory=dict)  # a gate's candidate


@dataclass(frozen=True)
class Event(Step):
    live: Mapping[str, float] = field(default_factory=dict)  # per class, live after this event
    live_from: str = ""  # which approval that is, in words


def primary_by_class(report: Mapping[str, Any] | None, cell: str) -> dict[str, float]:
    """Each class's primary metric for ``cell``, the worst over its points (step 3)."""
    if not report or not cell:
        return {}
    classes = [c for c in report.get("classes") or [] if isinstance(c, Mapping)]
    try:
        primary = primary_metrics(classes)
    except ValueError:
        return {}
    out: dict[str, float] = {}
    for agg in report.get("aggregates") or []:
        cls = str(agg.get("class"))
        if agg.get("cell") != cell or cls not in primary:
            continue
        metric = primary[cls]
        got = value(agg.get("pooled") or {}, metric)
        if got is None:  # too few requests for p99: the p95 the analysis would judge at
            got = value(agg.get("pooled") or {}, metric.replace("_p99_", "_p95_"))
        if got is not None:
            out[cls] = max(out.get(cls, got), got)
    return out


def live_configs(steps: Sequence[Step]) -> list[Event]:
    """Each step with what is live after it (step 2)."""
    live: list[Step] = []  # approvals in force, oldest first
    out: list[Event] = []
    for s in steps:
        if s.kind == "approval":
            live.append(s)
        elif s.kind == "revocation":
            live = [a for a in live if a.approval_id != s.approval_id]
        top = live[-1] if live else None
        out.append(
            Event(
                **{k: getattr(s, k) for k in Step.__dataclass_fields__},
                live=dict(top.metrics) if top else {},
                live_from=f"#{top.experiment_id} {top.cell} approved by {top.who}"
                if top
                else "nothing approved",
            )
        )
    return out


SYMBOL = {"approval": "circle", "revocation": "triangle-down", "gate": "square"}


def chart(events: Sequence[Event], title: str) -> dict[str, Any]:
    """The plotly figure (step 4): x is time (UTC), y each class's primary metric in ms."""
    names: list[str] = []
    for e in events:
        for cls in [*e.live, *e.metrics, *e.candidate_metrics]:
            if cls not in names:
                names.append(cls)
    colours = class_colours(names)
    data: list[dict[str, Any]] = []
    for cls in names:
        xs, ys, text, symbols = [], [], [], []
        for e in events:
            xs.append(e.at.isoformat())
            ys.append(e.live.get(cls))
            text.append(f"{e.kind} #{e.experiment_id} {e.cell}: {e.text[:80]}<br>live: {e.live_from}")
            symbols.append(SYMBOL.get(e.kind, "circle"))
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{cls}: live config",
                "x": xs,
                "y": ys,
                "text": text,
                "hovertemplate": "%{text}<br>%{y:.1f} ms<extra>" + cls + "</extra>",
                "line": {"shape": "hv", "color": colours[cls]},
                "marker": {"symbol": symbols, "size": 10, "color": colours[cls]},
                "connectgaps": False,
            }
        )
        measured = [e for e in events if e.kind == "gate" and cls in e.metrics]
        if measured:
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": f"{cls}: live config as the gate measured it",
                    "x": [e.at.isoformat() for e in measured],
                    "y": [e.metrics[cls] for e in measured],
                    "text": [
                        f"gate #{e.experiment_id}: B0 (the live config) on its own window" for e in measured
                    ],
                    "hovertemplate": "%{text}<br>%{y:.1f} ms<extra>" + cls + "</extra>",
                    "marker": {"symbol": "diamond-open", "size": 11, "color": colours[cls]},
                }
            )
        gates = [e for e in events if e.kind == "gate" and cls in e.candidate_metrics]
        if gates:
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": f"{cls}: gate candidate",
                    "x": [e.at.isoformat() for e in gates],
                    "y": [e.candidate_metrics[cls] for e in gates],
                    "text": [f"gate #{e.experiment_id}: {e.text}" for e in gates],
                    "hovertemplate": "%{text}<br>%{y:.1f} ms<extra>" + cls + "</extra>",
                    "marker": {
                        "symbol": "x",
                        "size": 11,
                        "color": [PASS_COLOUR if e.text == "pass" else FAIL_COLOUR for e in gates],
                    },
                }
            )
    layout = base_layout(title, "time (UTC)", "primary metric (ms), worst over the points")
    layout["xaxis"]["type"] = "date"
    return {"data": data, "layout": layout}
