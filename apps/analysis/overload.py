"""Overload: did arrivals outrun completions through the window for B0 itself? Pure.

An open-loop replay offers a rate; when it is above what B0 serves, the queue grows for as long
as the window lasts and every latency that includes queueing (TTFT, end-to-end) measures the
length of the window, not the configuration. Advice drawn from such a run (retain, retune,
isolate) does not apply at that rate, so the report names it (docs/ANALYSIS.md "Overload").

Per done sweep run of B0 (``run_load``), two signals, either one enough:

1. the client's own count: requests in the system (planned arrival passed, not yet ended;
   cancellations the trace asked for left out) at the window's start, at each third and at its
   end. The queue grew through the window when that count rose in each third and grew by at
   least ``GROWTH_SHARE`` of the window's arrivals: a stable queue at the window's end differs
   from its start by its own fluctuation, not by a tenth of the window's traffic growing in
   every third. Arrivals minus completions in the window is exactly that growth, so
   ``completions_rps`` below ``arrivals_rps`` is the same fact in rates;
2. the scraped ``vllm:num_requests_waiting`` gauge: its mean rose in each third of the window
   and its least-squares slope over the window, times the window, is at least the same share
   of the arrivals. A run without scrapes in each third has no gauge verdict.

A point (mixture, rate) is overloaded when more than half of B0's done runs there are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apps.analysis.columns import RecordTable
from apps.analysis.metrics import Window

# The share of a window's arrivals the queue must grow by, rising in every third, to be called
# overload (see the module docstring).
GROWTH_SHARE = 0.1
THIRDS = 3


@dataclass(frozen=True)
class RunLoad:
    """What one B0 run's window shows of arrivals against completions."""

    run: str
    arrivals_rps: float  # requests planned in the window, per second
    completions_rps: float  # requests that ended in the window, per second
    growth_rps: float  # requests in the system at the window's end minus its start, per second
    rising: bool  # that count rose in every third of the window
    waiting_growth_rps: float | None  # the waiting gauge's slope over the window (None: too few scrapes)
    waiting_rising: bool | None
    overloaded: bool

    def to_json(self) -> dict[str, Any]:
        r = 6
        return {
            "run": self.run,
            "arrivals_rps": round(self.arrivals_rps, r),
            "completions_rps": round(self.completions_rps, r),
            "queue_growth_rps": round(self.growth_rps, r),
            "queue_rising": self.rising,
            "waiting_growth_rps": None
            if self.waiting_growth_rps is None
            else round(self.waiting_growth_rps, r),
            "waiting_rising": self.waiting_rising,
            "overloaded": self.overloaded,
        }


def _in_system(planned: np.ndarray, ended: np.ndarray, t: float) -> int:
    return int(np.count_nonzero(planned <= t) - np.count_nonzero(ended <= t))


def _waiting(
    series: Sequence[Sequence[float]], start_s: float, end_s: float, arrivals: int
) -> tuple[float | None, bool | None, bool]:
    """(slope in req/s, rising in each third, fires) of the waiting gauge over the window."""
    pts = np.asarray([(t, v) for t, v in series if start_s <= t < end_s], dtype=float).reshape(-1, 2)
    span = (end_s - start_s) / THIRDS
    thirds = [
        pts[(pts[:, 0] >= start_s + i * span) & (pts[:, 0] < start_s + (i + 1) * span), 1]
        for i in range(THIRDS)
    ]
    if any(third.size == 0 for third in thirds) or len(pts) < THIRDS:
        return None, None, False
    slope = float(np.polyfit(pts[:, 0], pts[:, 1], 1)[0])
    means = [float(third.mean()) for third in thirds]
    rising = all(b > a for a, b in zip(means, means[1:], strict=False))
    fires = rising and slope * (end_s - start_s) >= GROWTH_SHARE * arrivals
    return slope, rising, fires


def run_load(
    key: str, table: RecordTable, rows: np.ndarray, window: Window, waiting: Sequence[Sequence[float]] = ()
) -> RunLoad:
    """One run's arrivals against completions through its observation window (module docstring).

    ``rows``: the run's rows of ``table`` (warm-up included: it loads the server too);
    ``waiting``: the run's [[t_s, value], ...] of ``vllm:num_requests_waiting``, from the same origin.
    """
    keep = rows[~table.cancelled[rows]]
    planned = table.planned_ns[keep]
    ended = table.end_ns[keep]
    ended = np.where(np.isnan(ended), np.inf, ended)
    start, end = float(window.start_ns), float(window.end_ns)
    obs = window.observation_s
    edges = np.linspace(start, end, THIRDS + 1)
    counts = [_in_system(planned, ended, float(t)) for t in edges]
    arrivals = int(np.count_nonzero((planned >= start) & (planned < end)))
    completions = int(np.count_nonzero((ended >= start) & (ended < end)))
    rising = all(b > a for a, b in zip(counts, counts[1:], strict=False))
    grew = counts[-1] - counts[0]
    slope, w_rising, w_fires = _waiting(waiting, start / 1e9, end / 1e9, arrivals)
    return RunLoad(
        run=key,
        arrivals_rps=arrivals / obs if obs > 0 else 0.0,
        completions_rps=completions / obs if obs > 0 else 0.0,
        growth_rps=grew / obs if obs > 0 else 0.0,
        rising=rising,
        waiting_growth_rps=slope,
        waiting_rising=w_rising,
        overloaded=(rising and arrivals > 0 and grew >= GROWTH_SHARE * arrivals) or w_fires,
    )


def overload_points(
    loads: Mapping[tuple[str, str], Sequence[RunLoad]],
    *,
    rates_rps: Mapping[tuple[str, str], float | None],
    capacities: Mapping[str, float | None],
    rates_source: str | None,
    agreed: set[tuple[str, str]],
) -> list[dict[str, Any]]:
    """Per (mixture, rate) with B0 runs: the runs' measures and whether the point is overloaded
    (more than half of them are), its offered rate against B0's measured capacity where the
    capacity probe measured one, and whether the decision judges that point (``agreed``)."""
    out = []
    for (mix, rate), runs in sorted(loads.items()):
        if not runs:
            continue
        over = sum(r.overloaded for r in runs)
        offered = rates_rps.get((mix, rate))
        if offered is None:
            offered = float(np.mean([r.arrivals_rps for r in runs]))
        capacity = capacities.get(mix)
        out.append(
            {
                "mixture": mix,
                "rate": rate,
                "agreed": (mix, rate) in agreed,
                "overloaded": over * 2 > len(runs),
                "runs_overloaded": over,
                "runs": [r.to_json() for r in runs],
                "offered_rps": round(float(offered), 6),
                "arrivals_rps": _mean([r.arrivals_rps for r in runs]),
                "completions_rps": _mean([r.completions_rps for r in runs]),
                "queue_growth_rps": _mean([r.growth_rps for r in runs]),
                "waiting_growth_rps": _mean(
                    [r.waiting_growth_rps for r in runs if r.waiting_growth_rps is not None]
                ),
                "capacity_rps": capacity,
                "offered_over_capacity": round(float(offered) / capacity, 4) if capacity else None,
                "rates_source": rates_source,
            }
        )
    return out


def _mean(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)), 6) if values else None


CALIBRATE = (
    "calibrate: give the spec a `calibration` block (docs/SCENARIOS.md) so B0's capacity is probed "
    "and the rates are frozen at fractions of it (e.g. near_capacity: 0.9), or judge only the rates B0 "
    "keeps up with (analysis.agreed_rates)"
)
RECALIBRATE = (
    "the rates were frozen from B0's probed capacity, yet B0 fell behind over this longer window: the "
    "probe's short runs can overstate a sustainable rate; lower calibration.fractions or lengthen "
    "calibration.observation_s (docs/SCENARIOS.md), or judge only the rates B0 keeps up with "
    "(analysis.agreed_rates)"
)


def calibrate_text(rates_source: str | None) -> str:
    """How to calibrate, given where the rates came from."""
    return RECALIBRATE if rates_source == "probe" else CALIBRATE
