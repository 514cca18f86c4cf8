"""Where a class's TTFT goes, as a stacked bar per cell at p50 and p99 (apps/analysis/ttft_parts.py),
and the rows the results page lists beside it. Pure; conventions in apps/analysis/charts.py.

Each bar is ONE request's parts (the request at that rank), so a bar's height is that request's
TTFT; the class's TTFT at that quantile is the black marker on it (apart from the bar only where
the request at the rank had no joined span and its nearest joined neighbour is split instead). A
per-run split (vLLM's histograms, no span joined) is drawn hatched and said so: its parts are
quantiles of different populations and need not add up to the marker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.analysis.chart_style import BASELINE_COLOUR, UrlFor, base_layout
from apps.analysis.report_types import JSONObject, StoredReport

# One colour per part, the engine's parts warm, the rest cool; the same on every chart.
PART_COLOURS = {
    "queue_ms": "#d62728",
    "prefill_ms": "#ff7f0e",
    "front_end_ms": "#9467bd",
    "server_rest_ms": "#c49c94",
    "network_ms": "#1f77b4",
    "send_delay_ms": "#7f7f7f",
}
QUANTILE_LABELS = (("p50", "p50"), ("p99", "p99"))


def _label(cell: str, baseline: str) -> str:
    return f"{cell} (B0)" if cell == baseline else cell


def ttft_parts_bars(
    *,
    parts: Mapping[str, Any],
    cells: Sequence[str],
    baseline: str,
    class_name: str,
    mixture: str,
    rate: str,
    url_for_cell: UrlFor,
) -> dict[str, Any] | None:
    """One class's stacked bars at (mixture, rate): B0 then each candidate, p50 and p99 each; None
    when no cell has a row there."""
    rows = {
        r["cell"]: r
        for r in parts.get("rows") or []
        if r["mixture"] == mixture and r["rate"] == rate and r["class"] == class_name
    }
    order = [c for c in [baseline, *[c for c in cells if c != baseline]] if c in rows]
    if not order:
        return None
    x_cells = [_label(c, baseline) for c in order for _ in QUANTILE_LABELS]
    x_q = [q for _ in order for q, _ in QUANTILE_LABELS]
    data: list[dict[str, Any]] = []
    for comp in parts.get("components") or []:
        key = comp["key"]
        ys: list[float | None] = []
        text: list[str] = []
        custom: list[str] = []
        patterns: list[str] = []
        for cell in order:
            row = rows[cell]
            for q, _ in QUANTILE_LABELS:
                at = row[q]
                value = (at.get("parts") or {}).get(key)
                ys.append(value)
                who = (
                    f"request {at['request']['index']} of run {str(at['request']['run'])[:8]}"
                    if at.get("request")
                    else "per run (vLLM's histograms), not per request"
                )
                text.append(
                    f"{cell} · {class_name} · {q}: {comp['label']} "
                    + (f"{value:,.1f} ms" if value is not None else "—")
                    + f"<br>{who}"
                    + (f"<br>{at['note']}" if at.get("note") else "")
                )
                custom.append(url_for_cell(cell=cell, mixture=mixture, rate=rate))
                patterns.append("" if row["per_request"] else "/")
        if all(v is None for v in ys):
            continue
        data.append(
            {
                "type": "bar",
                "name": comp["label"],
                "x": [x_cells, x_q],
                "y": ys,
                "text": text,
                "hoverinfo": "text",
                "textposition": "none",
                "customdata": custom,
                "marker": {"color": PART_COLOURS.get(key, "#999999"), "pattern": {"shape": patterns}},
            }
        )
    ttft, ttft_text, symbols = [], [], []
    for cell in order:
        for q, _ in QUANTILE_LABELS:
            at = rows[cell][q]
            value = at.get("ttft_ms") if not at.get("censored") else at.get("above_ms")
            ttft.append(value)
            symbols.append("diamond-open" if at.get("censored") else "diamond")
            ttft_text.append(
                f"{cell} · {class_name} TTFT {q} "
                + ("above " if at.get("censored") else "")
                + (f"{value:,.1f} ms" if value is not None else "—")
            )
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "the class's TTFT at p50 / p99",
            "x": [x_cells, x_q],
            "y": ttft,
            "text": ttft_text,
            "hoverinfo": "text",
            "marker": {"color": BASELINE_COLOUR, "symbol": symbols, "size": 9},
        }
    )
    layout = base_layout(
        f"Where {class_name}'s TTFT goes — {mixture} @ {rate}",
        "cell · the request at p50 and at p99 (hatched: per run, not per request)",
        "time to first token (ms)",
        barmode="relative",
    )
    return {"data": data, "layout": layout}


def _at_text(at: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    parts = at.get("parts") or {}
    return {
        "ttft_ms": at.get("ttft_ms"),
        "censored": bool(at.get("censored")),
        "above_ms": at.get("above_ms"),
        "parts": [(labels[k], v) for k, v in parts.items() if v is not None and k in labels],
        "request": at.get("request"),
        "request_ttft_ms": at.get("request_ttft_ms"),
        "note": at.get("note"),
    }


def parts_rows(report: StoredReport, *, mixture: str, rate: str) -> list[JSONObject]:
    """The split's rows at (mixture, rate) for the table under the bars, per class with B0 first:
    each quantile's TTFT and its parts as (label, ms) in stacking order."""
    baseline = report.get("baseline")
    parts = report.get("ttft_parts") or {}
    labels = {c["key"]: c["label"] for c in parts.get("components") or []}
    rows = [r for r in parts.get("rows") or [] if r["mixture"] == mixture and r["rate"] == rate]
    rows.sort(key=lambda r: (r["class"], r["cell"] != baseline))
    return [
        {
            "cell": r["cell"],
            "class": r["class"],
            "source": r["source"],
            "per_request": r["per_request"],
            "runs": len(r["runs"]),
            "runs_total": r["runs_total"],
            "requests": r["requests"],
            "joined": r["joined"],
            "joined_share": r["joined_share"],
            "runs_without_spans": r["runs_without_spans"],
            "p50": _at_text(r["p50"], labels),
            "p99": _at_text(r["p99"], labels),
            "note": r["note"],
        }
        for r in rows
    ]


def ttft_parts_figures(
    report: StoredReport,
    *,
    cells: Sequence[str],
    baseline: str,
    mixture: str,
    rate: str,
    url_for_cell: UrlFor,
) -> list[tuple[str, str, dict[str, Any]]]:
    """(chart id, class, figure) per class with a row at (mixture, rate); [] for a report made
    before the split."""
    parts = report.get("ttft_parts")
    if not parts:
        return []
    out = []
    for i, c in enumerate(report.get("classes", [])):
        fig = ttft_parts_bars(
            parts=parts,
            cells=cells,
            baseline=baseline,
            class_name=c["name"],
            mixture=mixture,
            rate=rate,
            url_for_cell=url_for_cell,
        )
        if fig is not None:
            out.append((f"ttft-parts-{i}", c["name"], fig))
    return out
