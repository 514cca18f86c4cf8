"""Open-loop arrival times: constant, Poisson and gamma (bursty) processes.

Pure: numpy only. Every draw comes from a ``numpy.random.Generator`` built
from an explicit integer seed (PCG64 gives the same stream on every machine),
so a (seed, process, rate, cv, duration) always yields the same arrivals.
Arrival times never depend on completions: that is what makes the load open.
"""

from __future__ import annotations

import math

import numpy as np

PROCESSES = ("constant", "poisson", "gamma")


class ArrivalError(ValueError):
    """Arrival parameters that cannot describe a process."""


def _check(process: str, rate_rps: float, cv: float | None) -> None:
    if process not in PROCESSES:
        raise ArrivalError(f"arrival process must be one of {', '.join(PROCESSES)}, got {process!r}")
    if not (isinstance(rate_rps, (int, float)) and math.isfinite(rate_rps) and rate_rps > 0):
        raise ArrivalError(f"rate_rps must be a positive number, got {rate_rps!r}")
    if process == "gamma" and not (cv is not None and math.isfinite(cv) and cv > 0):
        raise ArrivalError(f"the gamma process needs a positive cv, got {cv!r}")


def inter_arrival_times(
    *, process: str, rate_rps: float, count: int, rng: np.random.Generator, cv: float | None = None
) -> np.ndarray:
    """``count`` inter-arrival gaps (seconds) with mean 1/rate_rps.

    The gamma process uses shape 1/cv^2 and scale cv^2/rate, so the gaps have
    mean 1/rate and coefficient of variation ``cv`` (cv = 1 is Poisson,
    cv > 1 is bursty: long quiet spells broken by clumps of arrivals).
    """
    _check(process, rate_rps, cv)
    mean = 1.0 / rate_rps
    if process == "constant":
        return np.full(count, mean)
    if process == "poisson":
        return rng.exponential(mean, size=count)
    assert cv is not None
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, mean / shape, size=count)


def arrival_times(
    *, process: str, rate_rps: float, duration_s: float, seed: int, cv: float | None = None
) -> np.ndarray:
    """Arrival times in [0, duration_s), sorted, for one seeded process.

    The first arrival is one gap after 0 (the process is already running when
    the window opens) except for ``constant``, which starts at 0. Gaps are
    drawn in deterministic batches until the window is passed, so the result
    depends only on the arguments.
    """
    _check(process, rate_rps, cv)
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ArrivalError(f"duration_s must be positive, got {duration_s!r}")
    if process == "constant":
        step = 1.0 / rate_rps
        return np.arange(math.ceil(duration_s * rate_rps - 1e-9)) * step
    rng = np.random.default_rng(seed)
    batch = max(64, int(duration_s * rate_rps * 1.25) + 64)
    chunks: list[np.ndarray] = []
    end = 0.0
    while end < duration_s:
        gaps = inter_arrival_times(process=process, rate_rps=rate_rps, count=batch, rng=rng, cv=cv)
        times = end + np.cumsum(gaps)
        chunks.append(times)
        end = float(times[-1])
    times = np.concatenate(chunks)
    return times[times < duration_s]


def uniform_companion(times: np.ndarray, *, duration_s: float) -> np.ndarray:
    """Constant spacing for the same number of requests over the same window.

    Same count and same span give the same realised mean rate as the bursty
    trace, so a uniform-vs-bursty comparison isolates burstiness: request i
    arrives at i * duration_s / n.
    """
    n = len(times)
    if n == 0:
        return np.zeros(0)
    return np.arange(n) * (duration_s / n)


def coefficient_of_variation(values: np.ndarray) -> float:
    """Population std (ddof 0) over the mean; NaN when undefined."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return math.nan
    mean = float(values.mean())
    if mean == 0:
        return math.nan
    return float(values.std(ddof=0) / mean)
