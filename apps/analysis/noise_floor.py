"""The noise floor beside every comparison: how far whole runs of one config spread, and what an
A/A control cell (B0's config run again) measured against B0. Pure.

paired.py calls ``noise_floor`` for each comparison and ``control_cells`` / ``aa_cells`` once
per sweep; docs/ANALYSIS.md ("The noise floor") says what each number means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from apps.analysis import compare, inference
from apps.analysis.report_inputs import CellInput


def control_cells(cells: Sequence[CellInput], baseline: str) -> set[str]:
    """The cells the spec marks ``control: true``: A/A cells, B0's effective config run again
    (apps/experiments/spec_cross.py holds them to it). Never recommended, never in the gain family."""
    return {c["cell_id"] for c in cells if c.get("control") and c["cell_id"] != baseline}


def aa_cells(cells: Sequence[CellInput], baseline: str) -> list[str]:
    """A/A control cells: the marked controls first, then (for experiments made before the mark)
    candidates that run B0's own arguments on B0's engine. Their pairing with B0 shows the spread
    between whole runs directly, and their difference from B0 the measured noise floor."""
    marked = control_cells(cells, baseline)
    b0_spec = next((c for c in cells if c["cell_id"] == baseline), None)
    b0_args = (b0_spec.get("args") if b0_spec else None) or {}
    b0_engine = b0_spec.get("engine") if b0_spec else None
    same = [
        c["cell_id"]
        for c in cells
        if c["cell_id"] != baseline
        and c["cell_id"] not in marked
        and (c.get("args") or {}) == b0_args
        and c.get("engine") == b0_engine
    ]
    return [c["cell_id"] for c in cells if c["cell_id"] in marked] + same


def rel(sd: float | None) -> float | None:
    """A spread on the log scale as a relative change (0.2: one run typically 20% off another)."""
    return None if sd is None or not math.isfinite(sd) else round(math.expm1(sd), 6)


def noise_floor(
    result: compare.GroupResult, cell: str, metric: str | None, controls: Sequence[str]
) -> dict[str, Any]:
    """The spread between whole runs of the class's primary metric, shown beside its comparison
    (``controls``: the sweep's A/A cells, ``aa_cells``).

    ``b0_run_sd_rel``: B0's own repeats (the SD of their log values, as a relative change);
    ``aa_run_sd_rel``: an A/A control cell's rounds paired with B0's, where the spec has one;
    ``aa_diff``, ``aa_diff_rel``, ``aa_ci``: that A/A cell's observed difference from B0 (ms,
    relative to B0, and its interval): the measured noise floor beside every comparison;
    ``pooled_run_sd_rel``: the run-level model's (every complete cell of the point);
    ``used_run_sd_rel``: what this comparison's run-level test allowed for (the pool's, or the
    pair's own when larger). Relative: 0.2 means one run's value is typically 20% off another's.
    """
    repeats = len(next(iter(result.b0_repeats.values()), []))
    floor: dict[str, Any] = {"metric": metric, "repeats": repeats}
    if metric is None or metric not in result.b0_repeats:
        floor["note"] = "not enough requests to judge the primary metric"
        return floor
    floor["b0_run_sd_rel"] = rel(inference.run_spread(result.b0_repeats[metric]))
    aa = next((a for a in controls if a in result.repeats), None)
    floor["aa_cell"] = aa
    floor["aa_run_sd_rel"] = (
        rel(inference.pair_spread(result.repeats[aa][metric], result.b0_repeats[metric])) if aa else None
    )
    floor.update(aa_difference(result, aa, metric))
    fit = result.cell_fits.get(cell, result.fits).get(metric)
    floor["pooled_run_sd_rel"] = rel(fit.sd) if fit is not None and fit.scale == "log" else None
    floor["df"] = fit.df if fit is not None else None
    verdict = result.metrics.get(cell, {}).get(metric)
    floor["used_run_sd_rel"] = verdict.get("run_sd_rel") if verdict else None
    if repeats < 2:
        floor["note"] = (
            "one repeat: the spread between runs cannot be estimated, so nothing is called material"
        )
    return floor


def aa_difference(result: compare.GroupResult, aa: str | None, metric: str) -> dict[str, Any]:
    """The A/A cell's observed difference from B0 on the metric (ms, and relative to B0's value),
    with its interval: the measured noise floor, what B0's config run again moved by. Null where
    there is no A/A cell at the point, or its difference is not a number (a censored tail)."""
    verdict = result.metrics.get(aa, {}).get(metric) if aa else None
    if not verdict:
        return {"aa_diff": None, "aa_diff_rel": None, "aa_ci": None}
    diff, b0 = verdict.get("diff"), verdict.get("b0")
    finite = diff is not None and b0 is not None and math.isfinite(diff) and math.isfinite(b0) and b0 > 0
    return {
        "aa_diff": diff if finite else None,
        "aa_diff_rel": round(diff / b0, 6) if finite and diff is not None and b0 is not None else None,
        "aa_ci": list(verdict.get("ci") or []) or None,
    }
