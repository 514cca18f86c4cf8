"""The results page's figures and tables, from a stored report. Pure.

``results_figures`` turns a decision's report into the parts of the results page's template
context that come from the report alone (every figure and table); the view adds what needs
the database and the request (apps/experiments/views.py ``experiment_results``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from apps.analysis import cell_charts, parts_charts, run_charts
from apps.analysis.chart_style import UrlFor, class_colours
from apps.analysis.report_types import Comparison, JSONObject, StoredReport
from apps.analysis.spread import arrival_spread

# The server gauges drawn over time at the chosen point: the queue, then the KV cache.
# (gauge, what the title calls it, y axis title, unit, scale of the stored value)
GAUGE_FIGURES = (
    ("waiting", "Waiting requests", "waiting", "requests", 1.0),
    ("kv_usage", "KV cache usage", "KV cache usage", "%", 100.0),
)


def report_combos(report: StoredReport) -> list[tuple[str, str]]:
    """The report's (mixture, rate) points, sorted."""
    return sorted({(a["mixture"], a["rate"]) for a in report.get("aggregates", [])})


def cost_rows(report: StoredReport) -> dict[str, Any] | None:
    """Every cell's output tokens/s and $ per 1M output tokens (B0 first), from the report."""
    costs = report.get("costs")
    if not costs:
        return None  # a report stored before costs were computed
    reasons = {
        c["cell"]: c["reasons"]
        for c in ((report.get("decision") or {}).get("evidence") or {}).get("candidates", [])
    }
    rows = [
        {"cell": cell, **entry, "reasons": reasons.get(cell), "judged": cell in reasons}
        for cell, entry in (costs.get("cells") or {}).items()
    ]
    return {**costs, "rows": rows}


def pct(rel: float) -> str:
    """0.083 -> '8.3%', 0.25 -> '25%'."""
    return f"{rel * 100:.1f}%" if abs(rel) < 0.1 else f"{rel * 100:.0f}%"


def noise_floor_text(floor: Mapping[str, Any] | None) -> str | None:
    """A comparison's ``noise_floor`` (apps/analysis/paired.py) in words; None for a report made
    before it (nothing is shown)."""
    if not floor:
        return None
    repeats = int(floor.get("repeats") or 0)
    if repeats < 2:
        return "one repeat: nothing can be called material"
    b0, aa, aa_rel = floor.get("b0_run_sd_rel"), floor.get("aa_cell"), floor.get("aa_run_sd_rel")
    if b0 is not None:
        control = f"; A/A cell {aa}: {pct(aa_rel)}" if aa and aa_rel is not None else ""
        text = f"runs spread by {pct(b0)} (B0's {repeats} repeats{control})"
    elif floor.get("note"):
        text = str(floor["note"])
    else:
        text = f"B0's {repeats} repeats give no spread (a censored or unbounded value)"
    used = floor.get("used_run_sd_rel")
    if used is not None:
        text += f"; the test allowed for {pct(used)}"
    aa_diff = floor.get("aa_diff_rel")
    if aa and aa_diff is not None:
        text += f"; measured noise floor: A/A cell {aa} (B0 run again) {signed_pct(aa_diff)} against B0"
    return text


def signed_pct(rel: float) -> str:
    """0.031 -> '+3.1%', -0.25 -> '-25%'."""
    return ("+" if rel >= 0 else "") + pct(rel)


def comparison_rows(comparisons: Sequence[Comparison], *, mixture: str, rate: str) -> list[dict[str, Any]]:
    """Each comparison at (mixture, rate) on its class's primary metric, with its noise floor in
    words; [] for a report made before the noise floor (its page shows nothing extra)."""
    rows = [c for c in comparisons if c["mixture"] == mixture and c["rate"] == rate]
    if not any(c.get("noise_floor") for c in rows):
        return []
    out = []
    for c in rows:
        floor = c.get("noise_floor") or {}
        metric = c.get("primary") or floor.get("metric")
        v: Mapping[str, Any] = (c["metrics"].get(metric) or {}) if metric else {}
        b0, diff = v.get("b0"), v.get("diff")
        rel = diff / b0 if diff is not None and b0 and math.isfinite(b0) and math.isfinite(diff) else None
        out.append(
            {
                "cell": c["cell"],
                # The A/A control cell's own row: its difference is the noise floor itself.
                "control": floor.get("aa_cell") == c["cell"],
                "class": c["class"],
                "metric": metric,
                "b0": b0,
                "candidate": v.get("candidate"),
                "diff": diff,
                "diff_rel": pct(rel) if rel is not None else None,
                "direction": v.get("direction"),
                "material": bool(v.get("material")),
                "note": v.get("note"),
                "floor": noise_floor_text(floor),
            }
        )
    return out


def power_rows(power: Sequence[JSONObject]) -> list[dict[str, Any]]:
    """The power table's rows, with the spread between runs in words where the report has it
    (``run_sd_rel`` and ``repeats``: reports made since the run-level test)."""
    rows = []
    for p in power:
        entry: dict[str, Any] = dict(p)
        sd = p.get("run_sd_rel")
        if "repeats" in p:
            repeats = p.get("repeats")
            entry["run_spread"] = (
                f"{pct(float(sd))} over {repeats} repeats"
                if isinstance(sd, (int, float))
                else f"unknown ({repeats} repeat{'s' if repeats != 1 else ''})"
            )
        rows.append(entry)
    return rows


def results_figures(
    report: StoredReport,
    *,
    chosen: tuple[str, str],
    url_for_cell: UrlFor,
    url_for_run: Callable[[str], str],
) -> dict[str, Any]:
    """The results page's figures and tables at the (mixture, rate) ``chosen`` (the last point
    of the report when it has no such point), as template context.

    ``url_for_cell(cell=, mixture=, rate=)`` and ``url_for_run(key)`` are the pages a click on a
    point opens.
    """
    cells = [c["cell_id"] for c in report.get("cells", [])]
    baseline = report.get("baseline", cells[0] if cells else "")
    class_names = [c["name"] for c in report.get("classes", [])]
    combos = report_combos(report)
    if chosen not in combos:
        chosen = combos[-1] if combos else ("", "")
    mixture, rate = chosen
    power = power_rows((report.get("statistics") or {}).get("power") or [])
    rehearsals = report.get("rehearsals") or {}
    return {
        "rehearsals": rehearsals,
        "rehearsal_figures": [
            (cell, entry, run_charts.rehearsal_timeline(measures=entry["measures"], class_names=class_names))
            for cell, entry in sorted(rehearsals.items())
            if entry.get("measures")
        ],
        "rehearsal_cells": [c for c in cells if c != baseline],
        "report": report,
        "cells": cells,
        "baseline": baseline,
        "class_names": class_names,
        "class_colours": class_colours(class_names),
        "combos": [
            {
                "mixture": m,
                "rate": r,
                "active": (m, r) == chosen,
                "query": urlencode({"mixture": m, "rate": r}),
            }
            for m, r in combos
        ],
        "mixture": mixture,
        "rate": rate,
        **_figures(
            report,
            cells=cells,
            baseline=baseline,
            combos=combos,
            chosen=chosen,
            url_for_cell=url_for_cell,
            url_for_run=url_for_run,
        ),
        "spread": arrival_spread(runs=report.get("runs", []), classes=class_names, cells=cells),
        "findings": report.get("findings", []),
        "costs": cost_rows(report),
        # Where each class's TTFT goes at the chosen point, what bounds each tail at the agreed
        # points, the prefix cache's hit rates (absent from reports made before them).
        "ttft_parts_figures": parts_charts.ttft_parts_figures(
            report, cells=cells, baseline=baseline, mixture=mixture, rate=rate, url_for_cell=url_for_cell
        ),
        "ttft_parts_rows": parts_charts.parts_rows(report, mixture=mixture, rate=rate),
        "ttft_components": (report.get("ttft_parts") or {}).get("components") or [],
        "tail_bounds": report.get("tail_bounds") or [],
        "prefix_cache": report.get("prefix_cache")
        if (report.get("prefix_cache") or {}).get("enabled")
        else None,
        "natural": report.get("output_mode") == "natural",
        **_tables(report, mixture=mixture, rate=rate),
        "decision_data": report.get("decision", {}),
        "comparison_rows": comparison_rows(report.get("comparisons", []), mixture=mixture, rate=rate),
        "power_rows": power,
        # A report made since the run-level test states the spread between runs per row.
        "power_run_level": any("run_spread" in p for p in power),
        "power_target": next((p["target_rel"] for p in power if p.get("target_rel") is not None), None),
    }


def _figures(
    report: StoredReport,
    *,
    cells: list[str],
    baseline: str,
    combos: Sequence[tuple[str, str]],
    chosen: tuple[str, str],
    url_for_cell: UrlFor,
    url_for_run: Callable[[str], str],
) -> dict[str, Any]:
    """The results page's figures at the point ``chosen``: latency per cell (one per metric), the
    goodput and acceptance heat maps, the paired differences, the gauges over time, preemptions
    and uniform against bursty arrivals."""
    classes = report.get("classes", [])
    class_names = [c["name"] for c in classes]
    mixture, rate = chosen
    figures: list[tuple[str, dict[str, Any]]] = []
    if combos:
        for metric in ("ttft", "e2e", "stall"):
            figures.append(
                (
                    f"latency-{metric}",
                    cell_charts.latency_by_cell(
                        aggregates=report["aggregates"],
                        cells=cells,
                        baseline=baseline,
                        classes=classes,
                        metric=metric,
                        mixture=mixture,
                        rate=rate,
                        url_for_cell=url_for_cell,
                    ),
                )
            )
    heat_goodput, heat_accepted = cell_charts.goodput_heatmaps(
        aggregates=report.get("aggregates", []),
        runs=report.get("runs", []),
        cells=cells,
        combos=combos,
        url_for_cell=url_for_cell,
    )
    combo_runs = [
        r
        for r in report.get("runs", [])
        if r["mixture"] == mixture and r["rate"] == rate and not r.get("scenario")
    ]
    queue, kv = (
        run_charts.gauges_over_time(
            runs=combo_runs,
            cells=cells,
            baseline=baseline,
            gauge=gauge,
            title=f"{what} over time, {mixture} @ {rate}",
            y_title=y_title,
            unit=unit,
            url_for_run=url_for_run,
            scale=scale,
        )
        for gauge, what, y_title, unit, scale in GAUGE_FIGURES
    )
    return {
        "latency_figures": figures,
        "heat_goodput": heat_goodput,
        "heat_accepted": heat_accepted,
        "diffs": cell_charts.paired_diffs(
            comparisons=report.get("comparisons", []),
            cells=cells,
            classes=class_names,
            mixture=mixture,
            rate=rate,
            url_for_cell=url_for_cell,
        ),
        "queue": queue,
        "kv": kv,
        "preempt": run_charts.preemptions_by_cell(
            runs=report.get("runs", []), cells=cells, baseline=baseline, url_for_run=url_for_run
        ),
        "uniform": cell_charts.uniform_vs_bursty(
            runs=report.get("runs", []), classes=class_names, cells=cells, url_for_cell=url_for_cell
        ),
    }


def _tables(report: StoredReport, *, mixture: str, rate: str) -> dict[str, Any]:
    """The stop reasons per cell and class, and at (mixture, rate) the output strata and tails."""
    return {
        "stop_rows": [
            {"cell": cell, "class": cls, "reasons": sorted(counts.items())}
            for cell, by_class in (report.get("stop_reasons") or {}).items()
            for cls, counts in by_class.items()
        ],
        "strata_rows": [
            {"cell": a["cell"], "class": a["class"], "strata": a["pooled"].get("output_strata") or []}
            for a in report.get("aggregates", [])
            if a["mixture"] == mixture and a["rate"] == rate
        ],
        "tails": [
            {
                "cell": a["cell"],
                "class": a["class"],
                "ttft": a["pooled"]["ttft_ms"],
                "e2e": a["pooled"]["e2e_ms"],
            }
            for a in report.get("aggregates", [])
            if a["mixture"] == mixture and a["rate"] == rate
        ],
    }
