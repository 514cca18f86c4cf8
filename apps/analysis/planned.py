"""The power a plan states before anything runs: its request counts and the spread between runs. Pure.

A claim must pass both tests the analysis makes (docs/ANALYSIS.md "The run is the unit"), so
the change a plan finds with 80% power is the larger of two limits, as in the report's
``statistics.power`` (apps/analysis/paired.py ``_power``):

- within runs: the planned request counts (``inference.planned_power``: independent requests,
  an exponential tail);
- between runs: the run-level test at the spread between whole runs of the class's primary
  metric (``inference.rounds_detectable``), with the plan's repeats as rounds and its cells in
  the pool.

Nothing has run yet, so the spread is the one measured by the last analysed experiment of the
same model on the same hardware (the caller looks it up: apps/lifecycle/selectors.py), else
``DEFAULT_RUN_SD_REL``, stated as assumed. The change the verdict must be able to see is the
non-inferiority margin; where the plan cannot find it with 80% power, ``repeats_needed`` is the
fewest repeats that would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apps.analysis import inference

# The spread between whole runs assumed where no experiment has measured one: one run's value
# typically 25% off another's, inside the 10-40% measured on the CPU engine (issue #32).
DEFAULT_RUN_SD_REL = 0.25
# The most repeats a plan is told it could take.
MOST_REPEATS = 200


@dataclass(frozen=True)
class RunSpread:
    """The spread between whole runs of one class's primary metric, relative (0.25: one run's
    value typically 25% off another's). ``measured_in`` names the experiment it was measured in;
    None: assumed."""

    rel: float
    measured_in: str | None = None

    @property
    def sd(self) -> float:
        """On the log scale, as the run-level fit states it."""
        return math.log1p(self.rel)


ASSUMED = RunSpread(DEFAULT_RUN_SD_REL)


@dataclass(frozen=True)
class PlannedDesign:
    """One agreed (mixture, rate) and class of a plan: the smallest improvement of its primary
    metric found with 80% power, and what finding the non-inferiority margin would take."""

    mixture: str
    rate: str
    cls: str
    requests: int  # pooled over repeats
    level: str | None  # "p99", "p95" or None: not judgeable from the planned requests
    metric: str
    within_rel: float | None  # the request counts' limit; None: not judgeable
    run_sd_rel: float
    measured_in: str | None  # where the spread was measured; None: assumed
    between_rel: float | None  # the run-level limit; None: one repeat has no spread to test on
    detectable_rel: float | None  # the larger of the two and the material minimum; None: neither
    repeats: int
    target_rel: float  # the non-inferiority margin
    finds_target: bool
    repeats_needed: int | None  # where it does not: the fewest that would; None: none up to MOST_REPEATS
    note: str | None

    @property
    def assumed(self) -> bool:
        return self.measured_in is None


def _within(per_run: int, repeats: int, *, alpha: float, family: int) -> float:
    """The request counts' limit (relative) with ``repeats`` runs of ``per_run`` requests."""
    n = per_run * max(1, repeats)
    level = inference.judged_level(n)
    if level is None:
        return math.inf
    se = math.sqrt(2.0) * inference.quantile_rel_se(inference.QUANTILE_OF_LEVEL[level], n)
    return inference.detectable(se, alpha=alpha, family=family)


def _between(sd: float, repeats: int, *, cells: int, alpha: float, family: int) -> float:
    """The run-level limit as a relative improvement (a lower-is-better metric: 1 - e^-change)."""
    df = (max(2, cells) - 1) * (repeats - 1)
    change = inference.rounds_detectable(sd, rounds=repeats, df=df, alpha=alpha, family=family)
    return -math.expm1(-change) if math.isfinite(change) else math.inf


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def planned_design(
    points: Sequence[inference.PlannedPoint],
    *,
    spreads: Mapping[str, RunSpread],
    repeats: int,
    cells: int,
    candidates: int,
    alpha: float,
    target_rel: float,
    min_effect_rel: float = 0.0,
) -> list[PlannedDesign]:
    """Each planned point with both limits (``inference.planned_power``'s points, in its order).

    ``spreads`` by class name (``ASSUMED`` for a class it lacks); ``cells`` counts B0 and the
    candidates (the run-level fit pools them); the family is ``inference.planned_power``'s
    (candidates x classes x agreed points). A change below ``min_effect_rel`` is never called
    material, so the figure never goes below it.
    """
    family = max(1, len(points) * max(1, candidates))
    out: list[PlannedDesign] = []
    for p in points:
        spread = spreads.get(p.cls, ASSUMED)
        per_run = p.requests // max(1, repeats)

        def limit(r: int, per_run: int = per_run, spread: RunSpread = spread) -> float:
            return max(
                _within(per_run, r, alpha=alpha, family=family),
                _between(spread.sd, r, cells=cells, alpha=alpha, family=family),
                min_effect_rel,
            )

        within = _within(per_run, repeats, alpha=alpha, family=family)
        between = _between(spread.sd, repeats, cells=cells, alpha=alpha, family=family)
        detectable = limit(repeats)
        finds = detectable <= target_rel
        need = None
        if not finds:
            need = next(
                (r for r in range(max(2, repeats + 1), MOST_REPEATS + 1) if limit(r) <= target_rel), None
            )
        out.append(
            PlannedDesign(
                mixture=p.mixture,
                rate=p.rate,
                cls=p.cls,
                requests=p.requests,
                level=p.level,
                metric=p.metric,
                within_rel=_finite(within),
                run_sd_rel=spread.rel,
                measured_in=spread.measured_in,
                between_rel=_finite(between),
                detectable_rel=_finite(detectable),
                repeats=repeats,
                target_rel=target_rel,
                finds_target=finds,
                repeats_needed=need,
                note=None
                if finds
                else _note(p, spread, repeats, target_rel, need, per_run, within > between),
            )
        )
    return out


def _note(
    p: inference.PlannedPoint,
    spread: RunSpread,
    repeats: int,
    target: float,
    need: int | None,
    per_run: int,
    requests_bind: bool,
) -> str:
    source = f"measured in {spread.measured_in}" if spread.measured_in else "assumed"
    what = f"a {target:.0%} change of {p.cls} {p.metric}"
    if repeats < 2:
        head = "one repeat: the spread between runs cannot be estimated, so nothing can be called material"
    elif requests_bind:
        head = f"{per_run} {p.cls} requests per run are too few (runs spread by {spread.rel:.0%}, {source})"
    else:
        head = f"runs spread by {spread.rel:.0%} ({source})"
    if need is None:
        return f"{head}; no number of repeats up to {MOST_REPEATS} finds {what} with 80% power"
    return f"{head}; finding {what} with 80% power takes at least {need} repeats (this plan has {repeats})"
