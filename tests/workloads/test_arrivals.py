from __future__ import annotations

import numpy as np
import pytest

from apps.workloads.arrivals import (
    ArrivalError,
    arrival_times,
    coefficient_of_variation,
    inter_arrival_times,
    uniform_companion,
)


def test_it_spaces_constant_arrivals_exactly() -> None:
    times = arrival_times(process="constant", rate_rps=4.0, duration_s=2.0, seed=1)
    assert list(times) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]


@pytest.mark.parametrize(("process", "cv"), [("poisson", None), ("gamma", 2.5)])
def test_it_is_deterministic_per_seed(process: str, cv: float | None) -> None:
    a = arrival_times(process=process, rate_rps=5.0, duration_s=60.0, seed=42, cv=cv)
    b = arrival_times(process=process, rate_rps=5.0, duration_s=60.0, seed=42, cv=cv)
    c = arrival_times(process=process, rate_rps=5.0, duration_s=60.0, seed=43, cv=cv)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[: min(len(a), len(c))], c[: min(len(a), len(c))])
    assert np.all(np.diff(a) >= 0)
    assert a[0] >= 0 and a[-1] < 60.0


def test_it_draws_gamma_gaps_with_the_asked_cv_and_mean() -> None:
    gaps = inter_arrival_times(
        process="gamma", rate_rps=8.0, count=10_000, cv=3.0, rng=np.random.default_rng(5)
    )
    assert coefficient_of_variation(gaps) == pytest.approx(3.0, rel=0.10)
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.10)


def test_it_draws_poisson_gaps_with_cv_one() -> None:
    gaps = inter_arrival_times(process="poisson", rate_rps=3.0, count=10_000, rng=np.random.default_rng(6))
    assert coefficient_of_variation(gaps) == pytest.approx(1.0, rel=0.10)


def test_it_builds_a_uniform_companion_with_the_same_count_and_span() -> None:
    bursty = arrival_times(process="gamma", rate_rps=10.0, duration_s=30.0, seed=3, cv=3.0)
    even = uniform_companion(bursty, duration_s=30.0)
    assert len(even) == len(bursty)
    assert even[0] == 0.0
    assert np.allclose(np.diff(even), 30.0 / len(bursty))
    assert even[-1] < 30.0


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"process": "weibull", "rate_rps": 1.0}, "arrival process"),
        ({"process": "poisson", "rate_rps": 0.0}, "rate_rps"),
        ({"process": "gamma", "rate_rps": 1.0}, "positive cv"),
        ({"process": "gamma", "rate_rps": 1.0, "cv": -1.0}, "positive cv"),
    ],
)
def test_it_refuses_impossible_parameters(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ArrivalError, match=fragment):
        arrival_times(duration_s=10.0, seed=0, **kwargs)
