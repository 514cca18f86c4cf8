"""What every chart shares: the palettes, a colour per class and per cell, the base layout. Pure.

The conventions every chart keeps (apps/analysis/charts.py lists them) start here: a class has
one colour everywhere (``class_colours``), B0 is drawn in black, candidates in a separate
palette, and every axis has a title with its unit (``base_layout``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

CLASS_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
CELL_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")
BASELINE_COLOUR = "#222222"
PASS_COLOUR = "#1a7f37"
FAIL_COLOUR = "#b00020"

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


def base_layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
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
