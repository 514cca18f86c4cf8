"""Rates per mixture: typed in the spec, or frozen from each mixture's own probed capacity."""

from __future__ import annotations

import pytest

from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import validate_spec
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.runs.models import Run
from apps.runs.selectors import offered_load
from apps.workloads.services import trace_load
from tests.experiments.factories import make_experiment, small_spec
from tests.runs.factories import make_host
from tests.scenarios.test_services import (
    _calibrated_experiment,
    _fake_execute,
    _start,
    errors_of,
    model_dir,
    spec_with,
)

__all__ = ["model_dir"]  # the fixture, imported for this module

TWO_MIXTURES = {"80-20": {"short": 0.8, "long": 0.2}, "short-only": {"short": 1.0}}


def test_it_names_the_bad_mixture_rate_by_its_path() -> None:
    spec = small_spec()
    spec["workload"] = {
        **spec["workload"],
        "mixture_rates": {"nope": {"low": 1}, "80-20": {"high": 2, "low": -1}},
    }
    errors = errors_of(spec)
    assert errors["workload.mixture_rates.nope"].startswith("names unknown mixture 'nope'")
    assert errors["workload.mixture_rates.80-20.high"].startswith("names unknown rate 'high'")
    assert "workload.mixture_rates.80-20.low" in errors
    bad = errors_of(spec_with(calibration={"rates_per": "cell"}))
    assert bad["calibration.rates_per"] == "must be one of mixture, experiment, got 'cell'"


@pytest.mark.django_db
def test_it_plans_and_freezes_each_mixture_at_its_typed_rates(model_dir) -> None:  # type: ignore[no-untyped-def]
    make_host()
    spec = spec_with(model_dir)
    workload = {**spec["workload"], "mixtures": TWO_MIXTURES, "mixture_rates": {"short-only": {"low": 4.0}}}
    experiment = make_experiment(model=spec["model"], workload=workload)
    assert validate_spec(experiment_to_spec(experiment=experiment))["workload"]["mixture_rates"] == {
        "short-only": {"low": 4.0}
    }
    _start(experiment)
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    for mixture, rps in (("80-20", 1.0), ("short-only", 4.0)):
        runs = list(experiment.runs.filter(kind=Run.Kind.SWEEP, mixture=mixture))
        assert {r.rate_rps for r in runs} == {rps} and len({r.trace_sha256 for r in runs}) == 1
        assert trace_load(sha256=runs[0].trace_sha256).meta["rate_rps"] == rps
    assert offered_load(experiment=experiment)["per_mixture"] == {
        "80-20": {"low": 1.0},
        "short-only": {"low": 4.0},
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("rates_per", "expected"),
    [
        (
            "mixture",
            {"80-20": {"low": 0.9, "near_capacity": 2.7}, "short-only": {"low": 2.4, "near_capacity": 7.2}},
        ),
        (
            "experiment",
            {"80-20": {"low": 0.9, "near_capacity": 2.7}, "short-only": {"low": 0.9, "near_capacity": 2.7}},
        ),
    ],
)
def test_it_freezes_each_mixture_at_fractions_of_its_own_capacity(model_dir, rates_per, expected) -> None:  # type: ignore[no-untyped-def]
    make_host()
    spec = spec_with(model_dir)
    experiment = _calibrated_experiment(
        model_dir,
        calibration={"rates_per": rates_per, "tolerance": 0.01, "max_steps": 12},
        workload={**{k: v for k, v in spec["workload"].items() if k != "rates"}, "mixtures": TWO_MIXTURES},
    )
    _start(experiment)
    n = experiment_freeze_and_enqueue(
        experiment_id=experiment.pk, execute=_fake_execute({"80-20": 3.0, "short-only": 8.0})
    )
    assert n == 8  # 2 cells x 2 mixtures x 2 rates
    workload = experiment.workload.__class__.objects.get(pk=experiment.workload.pk)
    assert workload.rates_derivation["capacities"] == {"80-20": 3.0, "short-only": 8.0}
    for mixture, rates in expected.items():
        for rate_name, rps in rates.items():
            runs = list(experiment.runs.filter(kind=Run.Kind.SWEEP, mixture=mixture, rate_name=rate_name))
            assert {r.cell.cell_id for r in runs} == {"B0", "C1"}
            assert {r.rate_rps for r in runs} == {rps}
            assert len({r.trace_sha256 for r in runs}) == 1  # every cell replays the same bytes
            assert trace_load(sha256=runs[0].trace_sha256).meta["rate_rps"] == rps
    experiment.refresh_from_db()
    load = offered_load(experiment=experiment)
    assert load["per_mixture"] == expected
    assert ("of each mixture's own capacity" in load["said"]) == (rates_per == "mixture")
