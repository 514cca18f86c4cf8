"""Figures that compare the cells of an experiment at a (mixture, rate): latency per cell, the
goodput and acceptance heat maps, the paired differences with B0, uniform against bursty
arrivals. Pure; conventions in apps/analysis/charts.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.analysis.chart_style import FAIL_COLOUR, PASS_COLOUR, UrlFor, base_layout, class_colours
from apps.analysis.report_types import Aggregate, Comparison, RunResult
from apps.analysis.spread import arrival_spread

QUANTILE_SYMBOLS = {"p50": "circle", "p95": "diamond", "p99": "square"}
QUANTILE_SIZES = {"p50": 7, "p95": 8, "p99": 11}
LATENCY_METRICS = {
    "ttft": ("ttft_ms", "ttft_p99", "Time to first token", "ttft_p99_ms"),
    "e2e": ("e2e_ms", "e2e_p99", "End-to-end latency", "e2e_p99_ms"),
    "stall": ("max_stall_ms", "max_stall_p99", "Largest gap between tokens (max stall)", "max_stall_ms"),
}
DIFF_METRICS = (
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("e2e_p99_ms", "E2E p99 (ms)"),
    ("max_stall_p99_ms", "Max stall p99 (ms)"),
    ("goodput_rps", "Goodput (req/s)"),
)


def _value(p: Mapping[str, Any] | None) -> tuple[float | None, bool]:
    """A percentile entry as (value to draw, censored). Censored draws at its lower bound."""
    if not p:
        return None, False
    if p.get("censored"):
        return p.get("above_ms"), True
    return p.get("ms"), False


def _baseline_band(cells: Sequence[str], baseline: str) -> list[dict[str, Any]]:
    if baseline not in cells:
        return []
    i = list(cells).index(baseline)
    return [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": i - 0.5,
            "x1": i + 0.5,
            "y0": 0,
            "y1": 1,
            "fillcolor": "#e8e8e8",
            "opacity": 0.6,
            "layer": "below",
            "line": {"width": 0},
        }
    ]


def latency_by_cell(
    *,
    aggregates: Sequence[Aggregate],
    cells: Sequence[str],
    baseline: str,
    classes: Sequence[Mapping[str, Any]],
    metric: str,
    mixture: str,
    rate: str,
    url_for_cell: UrlFor,
) -> dict[str, Any]:
    """p50 / p95 / p99 per cell and class at one (mixture, rate), repeats pooled.

    Whiskers on p99 span the repeats' own p99 (min to max): the spread a
    reader must see before trusting a difference. The class's contract limit
    is a dashed line in the class colour; B0's column is shaded.
    """
    key, head, label, limit_key = LATENCY_METRICS[metric]
    names = [c["name"] for c in classes]
    colours = class_colours(names)
    rows = {(a["cell"], a["class"]): a for a in aggregates if a["mixture"] == mixture and a["rate"] == rate}
    offsets = {name: (i - (len(names) - 1) / 2) * 0.18 for i, name in enumerate(names)}
    data: list[dict[str, Any]] = []
    for name in names:
        for q in ("p50", "p95", "p99"):
            trace = _quantile_trace(
                rows=rows,
                cells=cells,
                name=name,
                q=q,
                key=key,
                head=head,
                offset=offsets[name],
                colour=colours[name],
                place=(mixture, rate),
                url_for_cell=url_for_cell,
            )
            if trace is not None:
                data.append(trace)
    shapes = _baseline_band(cells, baseline)
    off_scale = _contract_lines(shapes, data=data, classes=classes, colours=colours, limit_key=limit_key)
    layout = base_layout(
        f"{label} per cell — {mixture} @ {rate}",
        "cell (B0 shaded)",
        f"{label} (ms)",
        shapes=shapes,
    )
    layout["xaxis"].update(
        {
            "tickmode": "array",
            "tickvals": list(range(len(cells))),
            "ticktext": list(cells),
            "range": [-0.6, len(cells) - 0.4],
            "zeroline": False,
        }
    )
    layout["annotations"] = [
        {
            "xref": "paper",
            "yref": "paper",
            "x": 1,
            "y": 1.08,
            "showarrow": False,
            "xanchor": "right",
            "font": {"size": 11, "color": "#5b6474"},
            "text": "● p50  ◆ p95  ■ p99 (whiskers: repeat range)  - - contract · open marker: above (censored)",
        }
    ]
    if off_scale:
        # Said under the axis, where it cannot cover the key above the plot.
        layout["xaxis"]["title"]["text"] += " · contract above the chart: " + ", ".join(off_scale)
    return {"data": data, "layout": layout}


def _quantile_trace(
    *,
    rows: Mapping[tuple[str, str], Aggregate],
    cells: Sequence[str],
    name: str,
    q: str,
    key: str,
    head: str,
    offset: float,
    colour: str,
    place: tuple[str, str],
    url_for_cell: UrlFor,
) -> dict[str, Any] | None:
    """One class's markers for quantile ``q`` across the cells (p99 with its repeat whiskers);
    None when no cell has a value."""
    mixture, rate = place
    xs, ys, text, symbols, custom = [], [], [], [], []
    err_plus, err_minus = [], []
    for i, cell in enumerate(cells):
        a = rows.get((cell, name))
        if a is None:
            continue
        value, censored = _value(a["pooled"][key].get(q))
        if value is None:
            continue
        xs.append(i + offset)
        ys.append(value)
        symbols.append(QUANTILE_SYMBOLS[q] + ("-open" if censored else ""))
        n = a["pooled"]["counts"]["offered"]
        text.append(
            f"{cell} · {name} · {q} {'above ' if censored else ''}{value:,.1f} ms"
            f"<br>{n} requests, repeats {', '.join(str(r) for r in a['repeats'])}"
        )
        custom.append(url_for_cell(cell=cell, mixture=mixture, rate=rate))
        if q == "p99":
            reps = [v for v in a["variation"][head]["repeats"] if v is not None]
            err_plus.append(max(0.0, max(reps) - value) if reps else 0.0)
            err_minus.append(max(0.0, value - min(reps)) if reps else 0.0)
    if not xs:
        return None
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "markers",
        "name": f"{name} {q}",
        "legendgroup": name,
        "x": xs,
        "y": ys,
        "text": text,
        "hoverinfo": "text",
        "customdata": custom,
        "marker": {
            "color": colour,
            "symbol": symbols,
            "size": QUANTILE_SIZES[q],
            "line": {"width": 1, "color": colour},
        },
    }
    if q == "p99":
        trace["error_y"] = {
            "type": "data",
            "symmetric": False,
            "array": err_plus,
            "arrayminus": err_minus,
            "color": colour,
            "thickness": 1.5,
            "width": 4,
        }
    return trace


def _contract_lines(
    shapes: list[dict[str, Any]],
    *,
    data: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    colours: Mapping[str, str],
    limit_key: str,
) -> list[str]:
    """Append each class's contract limit to ``shapes`` as a dashed line; returns the limits
    too far above the highest point of ``data`` (whiskers included) to draw, in words."""
    top = 0.0
    for trace in data:
        plus = (trace.get("error_y") or {}).get("array") or [0.0] * len(trace["y"])
        top = max([top] + [y + e for y, e in zip(trace["y"], plus, strict=True)])
    off_scale = []
    for c in classes:
        limit = (c.get("contract") or c).get(limit_key)
        # A limit far above the data would flatten every point against the axis: name it instead.
        if limit is not None and top and limit > 1.5 * top:
            off_scale.append(f"{c['name']} {limit:,.0f} ms")
        elif limit is not None:
            shapes.append(
                {
                    "type": "line",
                    "xref": "paper",
                    "yref": "y",
                    "x0": 0,
                    "x1": 1,
                    "y0": limit,
                    "y1": limit,
                    "line": {"color": colours[c["name"]], "dash": "dash", "width": 1},
                }
            )
    return off_scale


def combo_label(mixture: str, rate: str) -> str:
    return f"{mixture} @ {rate}"


def goodput_heatmaps(
    *,
    aggregates: Sequence[Aggregate],
    runs: Sequence[RunResult],
    cells: Sequence[str],
    combos: Sequence[tuple[str, str]],
    url_for_cell: UrlFor,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Goodput (req/s, all classes) and accepted/offered (%) per cell x (mixture, rate).

    A tile passes (✓) when every done repeat kept every class's contract, and
    fails (✗) otherwise; a tile with no done run says so (—).
    """
    good: dict[tuple[str, str, str], float] = {}
    offered: dict[tuple[str, str, str], int] = {}
    accepted: dict[tuple[str, str, str], int] = {}
    for a in aggregates:
        k = (a["cell"], a["mixture"], a["rate"])
        good[k] = good.get(k, 0.0) + float(a["pooled"]["goodput_rps"] or 0.0)
        offered[k] = offered.get(k, 0) + int(a["pooled"]["counts"]["offered"])
        accepted[k] = accepted.get(k, 0) + int(a["pooled"]["counts"]["accepted"])
    verdict: dict[tuple[str, str, str], bool] = {}
    for r in runs:
        if r.get("scenario"):
            continue
        k = (r["cell"], r["mixture"], r["rate"])
        ok = r["status"] == "done" and all(m["contract"]["met"] for m in r["classes"].values())
        verdict[k] = verdict.get(k, True) and ok
    x = [combo_label(m, rate) for m, rate in combos]
    z_good, z_acc, t_good, t_acc, custom = [], [], [], [], []
    for cell in cells:
        row_g, row_a, txt_g, txt_a, row_c = [], [], [], [], []
        for m, rate in combos:
            k = (cell, m, rate)
            mark = {True: "✓", False: "✗"}.get(verdict[k], "—") if k in verdict else "—"
            g = good.get(k)
            share = (100.0 * accepted[k] / offered[k]) if offered.get(k) else None
            row_g.append(round(g, 3) if g is not None else None)
            row_a.append(round(share, 2) if share is not None else None)
            txt_g.append(f"{g:.2f} {mark}" if g is not None else "—")
            txt_a.append(f"{share:.1f}% {mark}" if share is not None else "—")
            row_c.append(url_for_cell(cell=cell, mixture=m, rate=rate))
        z_good.append(row_g)
        z_acc.append(row_a)
        t_good.append(txt_g)
        t_acc.append(txt_a)
        custom.append(row_c)
    height = max(260, 70 + 42 * len(cells))

    def heat(z: list[list[Any]], text: list[list[str]], title: str, unit: str, scale: Any, **kw: Any) -> dict:
        return {
            "data": [
                {
                    "type": "heatmap",
                    "x": x,
                    "y": list(cells),
                    "z": z,
                    "text": text,
                    "texttemplate": "%{text}",
                    "customdata": custom,
                    "hovertemplate": "%{y} · %{x}<br>%{text}<extra></extra>",
                    "colorscale": scale,
                    "colorbar": {"title": {"text": unit}},
                    **kw,
                }
            ],
            "layout": base_layout(
                title,
                "mixture @ rate",
                "cell",
                height=height,
                yaxis={"title": {"text": "cell"}, "autorange": "reversed", "automargin": True},
            ),
        }

    return (
        heat(
            z_good,
            t_good,
            "Goodput per cell (all classes, ✓ every class kept its contract)",
            "req/s",
            "Viridis",
        ),
        heat(
            z_acc,
            t_acc,
            "Accepted / offered per cell (✓ every class kept its contract)",
            "%",
            [[0.0, FAIL_COLOUR], [0.5, "#f6c143"], [1.0, PASS_COLOUR]],
            zmin=80,
            zmax=100,
        ),
    )


def paired_diffs(
    *,
    comparisons: Sequence[Comparison],
    cells: Sequence[str],
    classes: Sequence[str],
    mixture: str,
    rate: str,
    url_for_cell: UrlFor,
) -> dict[str, Any]:
    """Candidate − B0 per class with its bootstrap interval, one panel per metric.

    A filled marker is a material difference (interval excludes zero and the
    effect is above the minimum); open markers are within noise.
    """
    colours = class_colours(classes)
    rows = [c for c in comparisons if c["mixture"] == mixture and c["rate"] == rate]
    cand_cells = [c for c in cells if any(r["cell"] == c for r in rows)]
    n = len(DIFF_METRICS)
    gap = 0.04
    width = (1 - gap * (n - 1)) / n
    layout = base_layout(f"Candidate − B0, paired, {mixture} @ {rate}", "", "candidate cell")
    layout["height"] = max(280, 120 + 40 * len(cand_cells))
    layout["shapes"] = []
    data: list[dict[str, Any]] = []
    offsets = {name: (i - (len(classes) - 1) / 2) * 0.2 for i, name in enumerate(classes)}
    for j, (metric, title) in enumerate(DIFF_METRICS):
        axis = "" if j == 0 else str(j + 1)
        layout[f"xaxis{axis}"] = {
            "domain": [j * (width + gap), j * (width + gap) + width],
            "title": {"text": f"Δ {title}"},
            "zeroline": True,
            "zerolinecolor": "#888",
            "anchor": "y",
            "automargin": True,
        }
        layout["shapes"].append(
            {
                "type": "line",
                "xref": f"x{axis}",
                "yref": "paper",
                "x0": 0,
                "x1": 0,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#888", "width": 1},
            }
        )
        for name in classes:
            xs, ys, lo, hi, symbols, text, custom = [], [], [], [], [], [], []
            for r in rows:
                if r["class"] != name or r["cell"] not in cand_cells:
                    continue
                v = r["metrics"].get(metric)
                d = v.get("diff") if v else None
                if v is None or d is None:
                    continue
                ci = v.get("ci") or [None, None]
                xs.append(d)
                ys.append(cand_cells.index(r["cell"]) + offsets[name])
                lo.append(max(0.0, d - ci[0]) if ci[0] is not None else 0.0)
                hi.append(max(0.0, ci[1] - d) if ci[1] is not None else 0.0)
                symbols.append("circle" if v.get("material") else "circle-open")
                text.append(
                    f"{r['cell']} − B0 · {name} · {title}<br>Δ {d:,.2f} [{_fmt(ci[0])}, {_fmt(ci[1])}]"
                    f"<br>{v.get('direction', 'same')}{' (material)' if v.get('material') else ''}"
                )
                custom.append(url_for_cell(cell=r["cell"], mixture=mixture, rate=rate))
            if not xs:
                continue
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": name,
                    "legendgroup": name,
                    "showlegend": j == 0,
                    "xaxis": f"x{axis}",
                    "yaxis": "y",
                    "x": xs,
                    "y": ys,
                    "text": text,
                    "hoverinfo": "text",
                    "customdata": custom,
                    "marker": {"color": colours[name], "symbol": symbols, "size": 9},
                    "error_x": {
                        "type": "data",
                        "symmetric": False,
                        "array": hi,
                        "arrayminus": lo,
                        "color": colours[name],
                        "thickness": 1.5,
                    },
                }
            )
    layout["legend"] = {"orientation": "h", "y": -0.45, "yanchor": "top"}
    layout["margin"]["b"] = 110
    layout["yaxis"] = {
        "title": {"text": "candidate cell"},
        "zeroline": False,
        "tickmode": "array",
        "tickvals": list(range(len(cand_cells))),
        "ticktext": cand_cells,
        "range": [-0.6, len(cand_cells) - 0.4],
        "automargin": True,
    }
    return {"data": data, "layout": layout}


def _fmt(x: float | None) -> str:
    return "∞" if x is None else f"{x:,.2f}"


def uniform_vs_bursty(
    *,
    runs: Sequence[RunResult],
    classes: Sequence[str],
    cells: Sequence[str],
    url_for_cell: UrlFor,
) -> dict[str, Any] | None:
    """TTFT from p50 to p99 per class under the configured (bursty) arrivals and the uniform
    companion trace: one floating bar per process, from its p50 to its p99, so the spread
    burstiness adds is the bar's length (apps/analysis/spread.py). None when no uniform run."""
    rows = arrival_spread(runs=runs, classes=classes, cells=cells)
    if not rows:
        return None
    colours = class_colours(classes)
    keys = list(dict.fromkeys((r["cell"], r["mixture"], r["rate"]) for r in rows))
    labels = [f"{c} · {m} @ {r}" for c, m, r in keys]
    by_key = {(r["cell"], r["mixture"], r["rate"], r["class"], r["process"]): r for r in rows}
    data = []
    for name in classes:
        for kind in ("bursty", "uniform"):
            picked = [by_key[(*k, name, kind)] for k in keys]
            data.append(
                {
                    "type": "bar",
                    "name": f"{name} · {kind}",
                    "x": labels,
                    "base": [r["p50_ms"] for r in picked],
                    "y": [r["spread_ms"] for r in picked],
                    "customdata": [url_for_cell(cell=c, mixture=m, rate=r) for c, m, r in keys],
                    "text": [f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms" for r in picked],
                    "marker": {
                        "color": colours[name],
                        "pattern": {"shape": "" if kind == "bursty" else "/"},
                        "opacity": 1.0 if kind == "bursty" else 0.6,
                    },
                    "hovertemplate": f"{name} {kind}<br>%{{x}}: %{{text}}, spread %{{y:.1f}} ms<extra></extra>",
                }
            )
    layout = base_layout(
        "TTFT p50 to p99: configured arrivals vs uniform arrivals", "cell · mixture @ rate", "TTFT (ms)"
    )
    layout["barmode"] = "group"
    return {"data": data, "layout": layout}
