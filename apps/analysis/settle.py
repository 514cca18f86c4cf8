"""What would settle a comparison the verdict could not: the change a design detects, and the
repeats or window that would detect a given change with 80% power. Pure.

A claim must pass both tests the analysis makes (docs/ANALYSIS.md "The run is the unit"), so
the change a design finds with 80% power is the largest of three limits, as the report's
``statistics.power`` states it (apps/analysis/paired.py builds both from one ``Design``):

1. within runs: (z(1 - alpha/m) + z(0.8)) x SE, SE = sqrt(2) x B0's own bootstrap spread
   (``inference.detectable``). That SE falls with the square root of the requests judged, so
   r repeats of windows k times as long as this design's give ``within x sqrt(R / (r k))``
   (R: this design's repeats), as the plan's own estimate scales with its request counts
   (apps/analysis/planned.py);
2. between runs: the run-level test at the spread between whole runs the fit measured
   (``inference.rounds_detectable``), with (cells - 1)(r - 1) degrees of freedom at r repeats.
   A longer window is not counted on to narrow that spread: the figure stays the one measured;
3. the material threshold: a smaller change is never called material, whatever the design.

``Design.to_detect(change)`` then gives the fewest repeats (at this window) and the shortest
window (at these repeats) with which the design finds that change, or says why none does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.analysis import compare, inference
from apps.analysis.compare_options import CompareOptions
from apps.analysis.planned import MOST_REPEATS

# The longest window stated, in multiples of this design's: beyond it, more repeats are the answer.
MOST_WINDOW_FACTOR = 16.0


def _as_decrease(log_change: float) -> float:
    """A log-scale change b as the relative decrease 1 - e^-b (the form repeats_needed targets)."""
    return -math.expm1(-log_change) if math.isfinite(log_change) else math.inf


@dataclass(frozen=True)
class Needed:
    """What finding a change of ``change_rel`` (relative to B0) with 80% power takes."""

    change_rel: float
    detectable_rel: float  # what this design finds (inf: nothing)
    found: bool  # this design already finds a change this size
    below_material: bool  # smaller than the material threshold: no design calls it material
    repeats: int | None  # fewest repeats at this window that find it (None: none up to MOST_REPEATS)
    window_s: float | None  # shortest window at these repeats that finds it (None: none up to 16x)
    spread_known: bool  # the spread between runs was measured (two repeats or more)


@dataclass(frozen=True)
class Design:
    """One metric of one (mixture, rate, class) as this experiment measured it on B0's runs."""

    metric: str
    b0: float  # B0's value (ms)
    within_rel: float  # the request counts' limit at this design, relative to B0 (inf: none)
    run_sd: float | None  # the fit's spread between runs, log scale (None: not measured)
    rounds: int  # repeat rounds of the fit (or of B0's runs where there is no fit)
    df: int  # the fit's degrees of freedom
    cells: int  # cells in the run-level pool
    alpha: float  # the family's alpha
    family: int  # the family's size (the strictest Holm step)
    floor_rel: float  # the material threshold relative to B0
    observation_s: float | None  # the window of B0's runs

    def between_rel(self, rounds: int | None = None) -> float:
        """The run-level limit at ``rounds`` repeats (default: this design's), relative."""
        if self.run_sd is None:
            return math.inf
        r = self.rounds if rounds is None else rounds
        df = self.df if r == self.rounds else (max(2, self.cells) - 1) * (r - 1)
        change = inference.rounds_detectable(
            self.run_sd, rounds=r, df=df, alpha=self.alpha, family=self.family
        )
        return _as_decrease(change)

    def detectable_rel(self, rounds: int | None = None, window: float = 1.0) -> float:
        """The smallest change found with 80% power with ``rounds`` repeats of windows ``window``
        times this design's (defaults: this design)."""
        r = self.rounds if rounds is None else rounds
        within = self.within_rel * math.sqrt(max(1, self.rounds) / (max(1, r) * window))
        return max(within, self.between_rel(r), self.floor_rel)

    def to_detect(self, change_rel: float) -> Needed:
        """The repeats (at this window) or the window (at these repeats) that find ``change_rel``."""
        change = abs(change_rel)
        here = self.detectable_rel()
        below = change < self.floor_rel
        found = not below and here <= change
        repeats = window_s = None
        if not below and not found and self.run_sd is not None:
            repeats = next(
                (r for r in range(self.rounds + 1, MOST_REPEATS + 1) if self.detectable_rel(r) <= change),
                None,
            )
        if not below and not found and self.between_rel() <= change and math.isfinite(self.within_rel):
            factor = (self.within_rel / change) ** 2 if change > 0 else math.inf
            if factor <= MOST_WINDOW_FACTOR and self.observation_s:
                window_s = float(math.ceil(self.observation_s * max(1.0, factor)))
        return Needed(
            change_rel=change,
            detectable_rel=here,
            found=found,
            below_material=below,
            repeats=repeats,
            window_s=window_s,
            spread_known=self.run_sd is not None,
        )


def design_of(
    result: compare.GroupResult,
    metric: str,
    observation_s: float | None,
    options: CompareOptions,
    family: int,
) -> Design:
    """What B0's runs at one point let ``metric`` detect: the within-run limit from B0's own
    bootstrap spread (``result``: the point's compare.compare_group), the run-level fit's spread
    (log scale only: a plain-scale fit has no relative spread), the material threshold."""
    b0 = result.b0[metric]
    se = math.sqrt(2.0) * result.b0_se[metric]
    mde = inference.detectable(se, alpha=options.family_alpha, family=family)
    fit = result.fits.get(metric)
    log_fit = fit if fit is not None and fit.scale == "log" else None
    positive = math.isfinite(b0) and b0 > 0
    return Design(
        metric=metric,
        b0=b0,
        within_rel=mde / b0 if positive else math.inf,
        run_sd=log_fit.sd if log_fit is not None else None,
        rounds=log_fit.rounds if log_fit is not None else len(result.b0_repeats.get(metric, [])),
        df=log_fit.df if log_fit is not None else 0,
        cells=len(log_fit.cells) if log_fit is not None else 2,
        alpha=options.family_alpha,
        family=family,
        floor_rel=compare.material_threshold(metric, b0, options) / b0 if positive else math.inf,
        observation_s=observation_s,
    )


def pct(x: float) -> str:
    """A relative change in words: 0.1734 -> '17%'; not finite -> 'no'."""
    return f"{x:.0%}" if math.isfinite(x) else "no"


def needed_text(design: Design, needed: Needed) -> str:
    """What ``needed`` says, in one clause: the design's limit, then what would find the change."""
    head = f"this design detects a change of {pct(needed.detectable_rel)} at 80% power"
    if not math.isfinite(needed.detectable_rel):
        head = "this design cannot detect any change at 80% power"
    what = f"{pct(needed.change_rel)} change"
    if needed.below_material:
        return (
            f"{head}; a {what} is below the material threshold ({pct(design.floor_rel)} of B0), "
            "so no number of repeats would call it material"
        )
    if needed.found:
        return f"{head}, so a true {what} would be found: the difference seen here is not one"
    if not needed.spread_known:
        tail = (
            f"the spread between runs is unknown with {design.rounds} repeat"
            f"{'s' if design.rounds != 1 else ''}: run at least 2 to measure it"
        )
    elif needed.repeats is None:
        tail = f"no number of repeats up to {MOST_REPEATS} detects a {what}"
    else:
        window = f" of {design.observation_s:g} s" if design.observation_s else ""
        tail = f"detecting a {what} takes {needed.repeats} repeats{window} (this design has {design.rounds})"
    if needed.window_s is not None:
        tail += f", or {design.rounds} repeats of a {needed.window_s:g} s window"
    elif (
        needed.spread_known
        and math.isfinite(design.between_rel())
        and design.between_rel() > needed.change_rel
    ):
        tail += "; a longer window alone does not (the spread between runs binds)"
    return f"{head}; {tail}"
