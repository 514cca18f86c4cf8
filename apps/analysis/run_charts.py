"""Figures drawn from the runs' own series: server gauges and preemptions per run across an
experiment, one run's request histogram and gauges, a rollback rehearsal's timeline. Pure;
conventions in apps/analysis/charts.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from apps.analysis.chart_style import base_layout, cell_colours, class_colours
from apps.analysis.report_types import RunResult


def gauges_over_time(
    *,
    runs: Sequence[RunResult],
    cells: Sequence[str],
    baseline: str,
    gauge: str,
    title: str,
    y_title: str,
    unit: str,
    url_for_run: Callable[[str], str],
    scale: float = 1.0,
) -> dict[str, Any]:
    """One line per run (colour = cell, B0 black): a server gauge against time since run start."""
    colours = cell_colours(cells, baseline)
    data = []
    shown: set[str] = set()
    for r in runs:
        series = ((r.get("server") or {}).get("gauges") or {}).get(gauge, {}).get("series") or []
        if not series:
            continue
        url = url_for_run(str(r["key"]))
        t0 = series[0][0]  # scrape clocks are per host: each run starts at its own first scrape
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": r["cell"],
                "legendgroup": r["cell"],
                "showlegend": r["cell"] not in shown,
                "x": [round(p[0] - t0, 3) for p in series],
                "y": [p[1] * scale for p in series],
                "customdata": [url] * len(series),
                "hovertemplate": f"{r['cell']} repeat {r['repeat']}<br>%{{x:.0f}} s: %{{y:.2f}} {unit}<extra></extra>",
                "line": {
                    "color": colours.get(r["cell"], "#999"),
                    "width": 2.5 if r["cell"] == baseline else 1.2,
                },
            }
        )
        shown.add(r["cell"])
    return {
        "data": data,
        "layout": base_layout(title, "time since the run's first scrape (s)", f"{y_title} ({unit})"),
    }


def preemptions_by_cell(
    *,
    runs: Sequence[RunResult],
    cells: Sequence[str],
    baseline: str,
    url_for_run: Callable[[str], str],
) -> dict[str, Any]:
    """Preemptions per run (one dot each) by cell; a dot opens its run."""
    colours = cell_colours(cells, baseline)
    data = []
    for cell in cells:
        pts = [
            r
            for r in runs
            if r["cell"] == cell
            and not r.get("scenario")
            and r.get("server", {}).get("counters", {}).get("preemptions") is not None
        ]
        if not pts:
            continue
        data.append(
            {
                "type": "box",
                "name": cell,
                "y": [r["server"]["counters"]["preemptions"] for r in pts],
                "boxpoints": "all",
                "jitter": 0.4,
                "pointpos": 0,
                "customdata": [url_for_run(str(r["key"])) for r in pts],
                "text": [f"{r['mixture']} @ {r['rate']} repeat {r['repeat']}" for r in pts],
                "marker": {"color": colours[cell]},
                "line": {"color": colours[cell]},
                "showlegend": False,
            }
        )
    return {
        "data": data,
        "layout": base_layout("Preemptions per run, by cell", "cell", "preemptions per run (count)"),
    }


def request_histogram(
    *, histogram: Mapping[str, Any], classes: Sequence[str], title: str, contracts: Mapping[str, float]
) -> dict[str, Any]:
    """One run's request-level distribution per class (counts per latency bucket)."""
    colours = class_colours(classes)
    width = histogram.get("width_ms") or 1.0
    series = histogram.get("series", {})
    top = max((p[0] + width for pts in series.values() for p in pts), default=0.0)
    data = []
    shapes = []
    for name in classes:
        points = series.get(name) or []
        if not points:
            continue
        limit = contracts.get(name)
        label = f"{name} (p99 contract {limit:,.0f} ms)" if limit is not None else name
        data.append(
            {
                "type": "bar",
                "name": label,
                "x": [p[0] + width / 2 for p in points],
                "y": [p[1] for p in points],
                "width": [width] * len(points),
                "marker": {"color": colours[name], "opacity": 0.65},
                "hovertemplate": f"{name}: %{{y}} requests at %{{x:.0f}} ms<extra></extra>",
            }
        )
        # A limit far off the data would squash the bars into one column: name it instead.
        if limit is not None and limit <= 1.5 * top:
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": limit,
                    "x1": limit,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": colours[name], "dash": "dash", "width": 1},
                }
            )
    layout = base_layout(title, "latency from planned arrival (ms)", "requests (count)", shapes=shapes)
    layout["barmode"] = "overlay"
    return {"data": data, "layout": layout}


def run_gauges(*, series: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, Any]:
    """One run's queue (waiting, running: requests) and KV usage (%) against time."""
    data = []
    styles = {
        "waiting": ("waiting requests", "#d62728", "y"),
        "running": ("running requests", "#1f77b4", "y"),
        "kv_usage": ("KV cache usage (%)", "#2ca02c", "y2"),
    }
    t0 = min((pts[0][0] for pts in series.values() if pts), default=0.0)
    for key, (label, colour, axis) in styles.items():
        pts = series.get(key) or []
        if not pts:
            continue
        scale = 100.0 if key == "kv_usage" else 1.0
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": label,
                "x": [round(t - t0, 3) for t, _ in pts],
                "y": [v * scale for _, v in pts],
                "yaxis": axis,
                "line": {"color": colour},
            }
        )
    layout = base_layout(
        "Server queue and KV cache over the run", "time since first scrape (s)", "requests (count)"
    )
    layout["yaxis2"] = {
        "title": {"text": "KV cache usage (%)"},
        "overlaying": "y",
        "side": "right",
        "range": [0, 100],
    }
    return {"data": data, "layout": layout}


def rehearsal_timeline(*, measures: Mapping[str, Any], class_names: Sequence[str]) -> dict[str, Any]:
    """A rollback rehearsal over time: per-second TTFT p99 per class (by arrival second), B0's
    waiting requests and KV use, the switch and the drain deadline as vertical lines.

    A second whose p99 landed on a request without a first token is drawn as an "x" at the
    top of its class's line (censored: above every drawn value)."""
    colours = class_colours(class_names)
    timeline = measures.get("timeline") or {}
    per_second = timeline.get("ttft_p99_ms_per_second") or {}
    finite = [p[1] for pts in per_second.values() for p in pts if p[1] is not None]
    top = max(finite, default=1000.0) * 1.1
    data: list[dict[str, Any]] = []
    for name in class_names:
        pts = per_second.get(name) or []
        if not pts:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{name} TTFT p99",
                "x": [p[0] for p in pts if p[1] is not None],
                "y": [p[1] for p in pts if p[1] is not None],
                "customdata": [p[2] for p in pts if p[1] is not None],
                "hovertemplate": f"{name}<br>%{{x:.0f}} s: %{{y:.0f}} ms (n=%{{customdata}})<extra></extra>",
                "line": {"color": colours[name]},
            }
        )
        censored = [p[0] for p in pts if p[1] is None]
        if censored:
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": f"{name}: no first token",
                    "x": censored,
                    "y": [top] * len(censored),
                    "marker": {"symbol": "x", "size": 10, "color": colours[name]},
                    "hovertemplate": f"{name}<br>%{{x:.0f}} s: a request got no first token<extra></extra>",
                }
            )
    for key, label, colour in (
        ("b0_waiting", "B0 waiting requests", "#d62728"),
        ("b0_kv_usage", "B0 KV cache (%)", "#2ca02c"),
    ):
        pts = timeline.get(key) or []
        if pts:
            scale = 100.0 if key == "b0_kv_usage" else 1.0
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": label,
                    "x": [p[0] for p in pts],
                    "y": [p[1] * scale for p in pts],
                    "yaxis": "y2",
                    "line": {"color": colour, "dash": "dot"},
                }
            )
    shapes = []
    annotations = []
    for x, label in ((measures.get("switch_at_s"), "switch"), (measures.get("cut_at_s"), "drain deadline")):
        if x is None:
            continue
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dash", "color": "#555"},
            }
        )
        annotations.append(
            {
                "x": x,
                "y": 1,
                "xref": "x",
                "yref": "paper",
                "text": label,
                "showarrow": False,
                "yanchor": "bottom",
            }
        )
    layout = base_layout(
        "Rollback rehearsal: TTFT p99 per class, B0's queue and KV cache",
        "time since the trace's start (s)",
        "TTFT p99 (ms)",
        shapes=shapes,
        annotations=annotations,
    )
    layout["yaxis2"] = {
        "title": {"text": "B0 waiting (count) / KV (%)"},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
    }
    return {"data": data, "layout": layout}
