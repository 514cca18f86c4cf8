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

The charts live in one module per concern, and this one names them all, so a
view reads ``charts.<figure>``:

- apps/analysis/chart_style.py: palettes, colours per class and cell, the base layout;
- apps/analysis/cell_charts.py: figures comparing cells at a (mixture, rate);
- apps/analysis/run_charts.py: figures from the runs' own series (gauges,
  preemptions, one run's histogram, a rollback rehearsal);
- apps/analysis/parts_charts.py: where a class's TTFT goes, a stacked bar per cell at p50 and p99;
- apps/analysis/results_charts.py: the results page's figures and tables from a report.
"""

from __future__ import annotations

from apps.analysis.cell_charts import (
    DIFF_METRICS,
    LATENCY_METRICS,
    QUANTILE_SIZES,
    QUANTILE_SYMBOLS,
    combo_label,
    goodput_heatmaps,
    latency_by_cell,
    paired_diffs,
    uniform_vs_bursty,
)
from apps.analysis.chart_style import (
    BASELINE_COLOUR,
    CELL_PALETTE,
    CLASS_PALETTE,
    FAIL_COLOUR,
    PASS_COLOUR,
    UrlFor,
    base_layout,
    cell_colours,
    class_colours,
)
from apps.analysis.parts_charts import ttft_parts_bars
from apps.analysis.results_charts import cost_rows, report_combos, results_figures
from apps.analysis.run_charts import (
    gauges_over_time,
    preemptions_by_cell,
    rehearsal_timeline,
    request_histogram,
    run_gauges,
)

__all__ = [
    "BASELINE_COLOUR",
    "CELL_PALETTE",
    "CLASS_PALETTE",
    "DIFF_METRICS",
    "FAIL_COLOUR",
    "LATENCY_METRICS",
    "PASS_COLOUR",
    "QUANTILE_SIZES",
    "QUANTILE_SYMBOLS",
    "UrlFor",
    "base_layout",
    "cell_colours",
    "class_colours",
    "combo_label",
    "cost_rows",
    "gauges_over_time",
    "goodput_heatmaps",
    "latency_by_cell",
    "paired_diffs",
    "preemptions_by_cell",
    "rehearsal_timeline",
    "report_combos",
    "request_histogram",
    "results_figures",
    "run_gauges",
    "ttft_parts_bars",
    "uniform_vs_bursty",
]
