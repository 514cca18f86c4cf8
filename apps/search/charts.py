"""The search's chart (#36 item 4): each measured trial a point, margin against throughput,
coloured by outcome, the Pareto front joined by a line, the confirmed trials starred, and a
click on a point opening its screening run (static/charts.js follows a URL in ``customdata``).

Built from ``selectors.search_report``'s trials; a trial with no measurement (failed, or still
running) has no point and is listed in the page's table with its reason instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from apps.analysis.chart_style import FAIL_COLOUR, PASS_COLOUR, base_layout
from apps.search.objective import BROKE, KEPT

OUTCOME_COLOURS = {KEPT: PASS_COLOUR, BROKE: FAIL_COLOUR}
FRONT_COLOUR = "#222222"


def _label(trial: Mapping[str, Any]) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(trial["params"].items()))
    return f"trial {trial['number']}: {knobs}"


def trials_figure(summary: Mapping[str, Any], url_for_run: Callable[[str], str]) -> dict[str, Any]:
    """A plotly figure of the measured trials; ``url_for_run(run_id)`` is a run's page."""
    measured = [
        t
        for t in summary["trials"]
        if t["outcome"] in OUTCOME_COLOURS and t["margin"] is not None and t["throughput_rps"] is not None
    ]
    data: list[dict[str, Any]] = []
    for outcome, colour in OUTCOME_COLOURS.items():
        points = [t for t in measured if t["outcome"] == outcome]
        if not points:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": {KEPT: "kept every contract", BROKE: "broke a contract"}[outcome],
                "x": [t["throughput_rps"] for t in points],
                "y": [t["margin"] for t in points],
                "text": [_label(t) for t in points],
                "customdata": [url_for_run(t["run_id"]) if t["run_id"] else "" for t in points],
                "marker": {
                    "color": colour,
                    "size": [14 if t["confirmed"] else 9 for t in points],
                    "symbol": ["star" if t["confirmed"] else "circle" for t in points],
                },
                "hovertemplate": "%{text}<br>margin %{y:.3f} at %{x:.2f} req/s<extra></extra>",
            }
        )
    front_numbers = set(summary["pareto"])
    front = sorted((t for t in measured if t["number"] in front_numbers), key=lambda t: t["throughput_rps"])
    if front:
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "Pareto front",
                "x": [t["throughput_rps"] for t in front],
                "y": [t["margin"] for t in front],
                "line": {"color": FRONT_COLOUR, "dash": "dot", "width": 1},
                "hoverinfo": "skip",
            }
        )
    layout = base_layout(
        "Screened trials: worst class's margin against throughput",
        "throughput at the screening point (req/s)",
        "worst class's margin to its contract",
    )
    layout["yaxis"]["rangemode"] = "normal"  # a broken contract is a negative margin
    layout["yaxis"]["zeroline"] = True
    return {"data": data, "layout": layout}
