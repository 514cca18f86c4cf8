"""Chart specs: pure functions from report aggregates to plotly figure dicts. No Django.

Templates embed each figure with ``json_script``; static/charts.js renders
every one on a page. Conventions every chart keeps, so pages read alike:

- every axis has a title with its unit;
- a class has one colour everywhere (``class_colours``), B0 is drawn in
  black or shaded grey, candidates in a separate palette;
- a point that stands for runs carries their page in ``customdata`` (a URL),
  and a click on it opens that page;
- a censored value (a percentile above what was observed) is drawn at its
  known lower bound with an open marker and said so in the hover text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from apps.analysis.spread import arrival_spread

CLASS_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
CELL_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")
BASELINE_COLOUR = "#222222"
PASS_COLOUR = "#1a7f37"
FAIL_COLOUR = "#b00020"
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

UrlFor = Callable[..., str]


def class_colours(class_names: Sequence[str]) -> dict[str, str]:
    """One colour per class, by the experiment's class order (stable across every chart)."""
    return {name: CLASS_PALETTE[i % len(CLASS_PALETTE)] for i, name in enumerate(class_names)}


def cell_colours(cell_ids: Sequence[str], baseline: str) -> dict[str, str]:
    out = {}
    i = 0
    for cell in cell_ids:
        if cell == baseline:
            out[cell] = BASELINE_COLOUR
        else:
            out[cell] = CELL_PALETTE[i % len(CELL_PALETTE)]
            i += 1
    return out


def _layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}},
        "xaxis": {"title": {"text": x_title}, "automargin": True},
        "yaxis": {"title": {"text": y_title}, "automargin": True, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"},
        "margin": {"l": 60, "r": 20, "t": 50, "b": 90},
        "height": 380,
        "hovermode": "closest",
        "plot_bgcolor": "#ffffff",
    }
    layout.update(extra)
    return layout


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
    aggregates: Sequence[Mapping[str, Any]],
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
    data: list[dict[str, Any]] = []
    offsets = {name: (i - (len(names) - 1) / 2) * 0.18 for i, name in enumerate(names)}
    for name in names:
        for q in ("p50", "p95", "p99"):
            xs, ys, text, symbols, custom = [], [], [], [], []
            err_plus, err_minus = [], []
            for i, cell in enumerate(cells):
                a = rows.get((cell, name))
                if a is None:
                    continue
                value, censored = _value(a["pooled"][key].get(q))
                if value is None:
                    continue
                xs.append(i + offsets[name])
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
                continue
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
                    "color": colours[name],
                    "symbol": symbols,
                    "size": QUANTILE_SIZES[q],
                    "line": {"width": 1, "color": colours[name]},
                },
            }
            if q == "p99":
                trace["error_y"] = {
                    "type": "data",
                    "symmetric": False,
                    "array": err_plus,
                    "arrayminus": err_minus,
                    "color": colours[name],
                    "thickness": 1.5,
                    "width": 4,
                }
            data.append(trace)
    shapes = _baseline_band(cells, baseline)
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
    layout = _layout(
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


def combo_label(mixture: str, rate: str) -> str:
    return f"{mixture} @ {rate}"


def goodput_heatmaps(
    *,
    aggregates: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any]],
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
            row_c.append(url_for_cell(cell=cell, mixture=m, rate=r))
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
            "layout": _layout(
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
    comparisons: Sequence[Mapping[str, Any]],
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
    layout = _layout(f"Candidate − B0, paired, {mixture} @ {rate}", "", "candidate cell")
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
                if not v or v.get("diff") is None:
                    continue
                d = v["diff"]
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


def gauges_over_time(
    *,
    runs: Sequence[Mapping[str, Any]],
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
        "layout": _layout(title, "time since the run's first scrape (s)", f"{y_title} ({unit})"),
    }


def preemptions_by_cell(
    *,
    runs: Sequence[Mapping[str, Any]],
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
        "layout": _layout("Preemptions per run, by cell", "cell", "preemptions per run (count)"),
    }


def uniform_vs_bursty(
    *,
    runs: Sequence[Mapping[str, Any]],
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
    layout = _layout(
        "TTFT p50 to p99: configured arrivals vs uniform arrivals", "cell · mixture @ rate", "TTFT (ms)"
    )
    layout["barmode"] = "group"
    return {"data": data, "layout": layout}


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
    layout = _layout(title, "latency from planned arrival (ms)", "requests (count)", shapes=shapes)
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
    layout = _layout(
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
    layout = _layout(
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
