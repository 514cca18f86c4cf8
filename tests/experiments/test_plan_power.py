"""The power the create page states before anything runs uses the spread between whole runs
(issue #32 item 3): the last analysed experiment's on the same hardware and model, else an
assumed one, stated as such; where the plan cannot find the non-inferiority margin, the repeats
it would take."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.utils import timezone

from apps.analysis import inference, planned
from apps.analysis.models import Decision
from apps.experiments.models import Experiment
from apps.experiments.spec import validate_spec
from apps.lifecycle import selectors
from apps.runs.models import Host
from tests.experiments.factories import make_experiment, small_spec

WORKLOAD = {**small_spec()["workload"], "repeats": 3, "rates": {"near": 6.0}, "observation_s": 120}


def _spec(**workload: Any) -> Any:
    return validate_spec(small_spec(workload={**WORKLOAD, **workload}))


def _host(name: str, hardware_id: str) -> Host:
    return Host.objects.create(
        name=name, queue=f"host.{name}", hardware_id=hardware_id, last_heartbeat=timezone.now()
    )


def _analysed(author: Any, *, name: str, hardware_id: str, power: list[dict[str, Any]]) -> Experiment:
    """An experiment analysed on ``hardware_id`` whose report's power table is ``power``."""
    experiment = make_experiment(owner=author, name=name)
    Experiment.objects.filter(pk=experiment.pk).update(hardware_id=hardware_id, status="analysed")
    Decision.objects.create(
        experiment=experiment, outcome="retain", rule="test", report={"statistics": {"power": power}}
    )
    return experiment


def _entry(cls: str, metric: str, run_sd_rel: float | None) -> dict[str, Any]:
    return {"mixture": "80-20", "rate": "low", "class": cls, "metric": metric, "run_sd_rel": run_sd_rel}


@pytest.mark.django_db
def test_without_an_earlier_experiment_it_assumes_the_stated_spread_and_names_the_repeats_needed(
    author,
) -> None:  # type: ignore[no-untyped-def]
    _host("gpu-a", "8x H100")
    estimate = selectors.plan_estimate(_spec())
    by = {p.cls: p for p in estimate.power}
    assert set(by) == {"short", "long"}
    for p in by.values():
        assert p.assumed and p.measured_in is None
        assert p.run_sd_rel == planned.DEFAULT_RUN_SD_REL == 0.25
        assert p.target_rel == estimate.target_rel == 0.25
    short = by["short"]
    # 6 req/s x 120 s x 80% x 3 repeats; the run-level limit is the larger one at a 25% spread.
    assert short.requests == 576 * 3
    assert short.between_rel is not None and short.within_rel is not None
    assert short.detectable_rel == max(short.within_rel, short.between_rel)
    # At three repeats a 25% spread hides a 25% change: the plan says how many repeats would find it.
    assert not short.finds_target and short in estimate.short_of_target
    assert short.repeats_needed is not None and short.repeats_needed > 3
    assert f"takes at least {short.repeats_needed} repeats (this plan has 3)" in (short.note or "")
    assert "assumed" in (short.note or "")
    # That many repeats do find it, one fewer does not.
    enough = {p.cls: p for p in selectors.plan_estimate(_spec(repeats=short.repeats_needed)).power}
    fewer = {p.cls: p for p in selectors.plan_estimate(_spec(repeats=short.repeats_needed - 1)).power}
    assert enough["short"].finds_target and enough["short"].detectable_rel <= 0.25
    assert not fewer["short"].finds_target


@pytest.mark.django_db
def test_it_takes_the_spread_of_the_last_analysed_experiment_on_the_same_hardware_and_model(author) -> None:  # type: ignore[no-untyped-def]
    _host("gpu-a", "8x H100")
    _analysed(author, name="older", hardware_id="8x H100", power=[_entry("short", "ttft_p99_ms", 0.4)])
    newest = _analysed(
        author,
        name="newest",
        hardware_id="8x H100",
        # The largest over its agreed points counts; a p95 is the same metric at another level.
        power=[_entry("short", "ttft_p99_ms", 0.08), _entry("short", "ttft_p95_ms", 0.1)],
    )
    # Another hardware's spread and another primary metric's are no evidence for this plan.
    _analysed(author, name="elsewhere", hardware_id="1x CPU", power=[_entry("long", "e2e_p99_ms", 0.02)])
    _analysed(author, name="other metric", hardware_id="8x H100", power=[_entry("long", "ttft_p99_ms", 0.03)])
    Decision.objects.filter(experiment__name="older").update(
        updated_at=timezone.now() - timezone.timedelta(days=1)
    )
    Decision.objects.filter(experiment__name="newest").update(updated_at=timezone.now())

    estimate = selectors.plan_estimate(_spec())
    by = {p.cls: p for p in estimate.power}
    assert by["short"].run_sd_rel == 0.1
    assert by["short"].measured_in == f"newest (#{newest.pk}, hardware 8x H100)"
    assert by["long"].assumed and by["long"].run_sd_rel == 0.25
    # A calmer host needs fewer repeats: the run-level figure is the model at that spread.
    assert by["short"].repeats_needed == inference.repeats_needed(
        math.log1p(0.1), 0.25, cells=2, alpha=0.05, family=len(estimate.power)
    )
    assert by["short"].repeats_needed < by["long"].repeats_needed  # type: ignore[operator]


@pytest.mark.django_db
def test_a_report_made_before_the_run_level_test_or_another_model_gives_no_spread(author) -> None:  # type: ignore[no-untyped-def]
    _host("gpu-a", "8x H100")
    _analysed(
        author, name="old report", hardware_id="8x H100", power=[{"class": "short", "metric": "ttft_p99_ms"}]
    )
    other = _analysed(
        author, name="other model", hardware_id="8x H100", power=[_entry("short", "ttft_p99_ms", 0.1)]
    )
    Experiment.objects.filter(pk=other.pk).update(model_path="/models/another")
    assert selectors.previous_run_spreads(_spec()) == {}
    assert all(p.assumed for p in selectors.plan_estimate(_spec()).power)


@pytest.mark.django_db
def test_the_create_page_states_the_spread_and_the_repeats_needed(client, author) -> None:  # type: ignore[no-untyped-def]
    from tests.ui.forms_data import form_data

    client.force_login(author)
    html = client.post("/experiments/new/", form_data()).content.decode()
    table = html[html.index('id="planned-power"') :]
    assert "spread between runs" in table and '25% <span class="run-spread-assumed">(assumed)</span>' in table
    assert "an assumed 25%" in html and "10-40%" in html
    assert 'id="repeats-needed"' in html and "with 80% power takes" in html


def _points(*, rate: float, repeats: int) -> list[inference.PlannedPoint]:
    return inference.planned_power(
        classes=[{"name": "short"}],
        mixtures={"m": {"short": 1.0}},
        rates={"r": rate},
        repeats=repeats,
        observation_s=120,
        candidates=1,
        alpha=0.05,
        primary={"short": "ttft_p99_ms"},
    )


def _design(*, rate: float, repeats: int, spread: float) -> planned.PlannedDesign:
    (design,) = planned.planned_design(
        _points(rate=rate, repeats=repeats),
        spreads={"short": planned.RunSpread(spread, "x (#1)")},
        repeats=repeats,
        cells=2,
        candidates=1,
        alpha=0.05,
        target_rel=0.25,
        min_effect_rel=0.05,
    )
    return design


def test_the_note_says_which_limit_binds_and_one_repeat_judges_nothing() -> None:
    one = _design(rate=6.0, repeats=1, spread=0.02)
    assert one.between_rel is None and one.detectable_rel is None and not one.finds_target
    assert (one.note or "").startswith("one repeat: the spread between runs cannot be estimated")
    assert one.repeats_needed is not None and one.repeats_needed >= 2
    # Few requests per run: the request counts bind, however calm the runs.
    sparse = _design(rate=0.5, repeats=3, spread=0.02)
    assert sparse.within_rel is not None and sparse.between_rel is not None
    assert sparse.within_rel > sparse.between_rel
    assert (sparse.note or "").startswith(
        "60 short requests per run are too few (runs spread by 2%, measured in x (#1))"
    )
    # Many requests and calm runs: found with these repeats, never below the material minimum.
    calm = _design(rate=50.0, repeats=5, spread=0.01)
    assert calm.finds_target and calm.note is None and calm.repeats_needed is None
    assert calm.detectable_rel is not None and calm.detectable_rel >= 0.05
