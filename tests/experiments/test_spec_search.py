"""The spec's ``search`` section (apps/experiments/spec_search.py, issue #36 item 1): a space of
knobs as sets or ranges, vLLM's rules between knobs checked at spec time, the budget and the
screening point with their defaults; each problem a field error naming the field. Pure: no database."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from apps.experiments.spec import SpecError, SpecLimits, plan_size, validate_spec
from apps.experiments.spec_search import grid_points, range_values
from tests.experiments.factories import SMALL_SPEC

RUNS = SpecLimits()


def _spec(**search: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    del spec["candidates"]
    spec["workload"]["mixtures"]["50-50"] = {"short": 0.5, "long": 0.5}
    spec["workload"]["rates"]["high"] = 3.0
    spec["search"] = {
        "space": {
            "max_num_batched_tokens": {"min": 256, "max": 4096, "log": True},
            "max_num_seqs": [4, 8, 16],
            "enable_chunked_prefill": [True, False],
        },
        **search,
    }
    return spec


def _errors(spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_spec(spec, limits=RUNS)
    return {e.path: e.message for e in info.value.errors}


def test_a_search_spec_is_normalised_with_its_defaults() -> None:
    out = validate_spec(_spec(), limits=RUNS)
    search = out["search"]
    assert out["candidates"] == []
    assert search["space"]["max_num_batched_tokens"] == {"min": 256, "max": 4096, "log": True}
    assert search["space"]["max_num_seqs"] == {"values": [4, 8, 16]}
    assert search["budget"] == {"max_trials": 60, "max_engine_hours": None, "patience": None}
    assert search["confirm"] == 3
    # The hardest agreed point: the mixture with most tokens per request, at the highest rate.
    assert search["screening"] == {"mixture": "50-50", "rate": "high", "chosen": "default"}


def test_the_screening_point_can_be_given_and_must_exist() -> None:
    out = validate_spec(_spec(screening={"mixture": "80-20", "rate": "low"}), limits=RUNS)
    assert out["search"]["screening"] == {"mixture": "80-20", "rate": "low", "chosen": "given"}
    errors = _errors(_spec(screening={"mixture": "90-10", "rate": "peak"}))
    assert "unknown mixture '90-10'" in errors["search.screening.mixture"]
    assert "unknown rate 'peak'" in errors["search.screening.rate"]


def test_a_spec_has_a_grid_or_a_search_not_both() -> None:
    spec = _spec()
    spec["candidates"] = copy.deepcopy(SMALL_SPEC["candidates"])
    assert "not both" in _errors(spec)["candidates"]
    grid = copy.deepcopy(SMALL_SPEC)
    del grid["candidates"]
    assert "non-empty list" in _errors(grid)["candidates"]


def test_each_knob_problem_names_its_field() -> None:
    spec = _spec()
    spec["search"]["space"] = {
        "dtype": ["auto"],
        "max_num_seqs": {"min": 64, "max": 8},
        "scheduling_policy": ["fcfs", "lottery"],
        "enable_chunked_prefill": {"min": 0, "max": 1},
        "long_prefill_token_threshold": [256, 256],
        "max_num_queued_reqs": "many",
    }
    errors = _errors(spec)
    assert "not a knob a search varies" in errors["search.space.dtype"]
    assert errors["search.space.max_num_seqs.max"] == "must be above min (64), got 8"
    assert "fcfs, priority" in errors["search.space.scheduling_policy[1]"]
    assert "only an integer knob takes a range" in errors["search.space.enable_chunked_prefill"]
    assert "repeats the value 256" in errors["search.space.long_prefill_token_threshold[1]"]
    assert "list of values or a range" in errors["search.space.max_num_queued_reqs"]


def test_budget_and_confirm_are_bounded() -> None:
    errors = _errors(
        _spec(budget={"max_trials": 2, "patience": 0, "max_engine_hours": -1, "extra": 1}, confirm=3)
    )
    assert "at least 1" in errors["search.budget.patience"]
    assert "positive" in errors["search.budget.max_engine_hours"]
    assert errors["search.budget.extra"] == "unknown field"
    assert "max_trials is 2" in errors["search.confirm"]
    assert "at most 500" in _errors(_spec(budget={"max_trials": 10_000}))["search.budget.max_trials"]


def test_a_budget_below_max_model_len_needs_chunked_prefill() -> None:
    # Chunked prefill searched: the budget range must reach max_model_len for the configs without it.
    spec = _spec()
    spec["search"]["space"]["max_num_batched_tokens"] = {"min": 256, "max": 1024, "log": True}
    assert (
        "vLLM refuses every config with chunked prefill off"
        in _errors(spec)["search.space.max_num_batched_tokens"]
    )
    # Chunked prefill off in every config (B0's): the whole range must hold a prompt.
    spec = _spec()
    spec["baseline"]["args"]["enable_chunked_prefill"] = False
    del spec["search"]["space"]["enable_chunked_prefill"]
    message = _errors(spec)["search.space.max_num_batched_tokens"]
    assert message.startswith("starts at 256, below controls.max_model_len (2048)")
    assert "baseline.args.enable_chunked_prefill" in message
    spec["search"]["space"]["max_num_batched_tokens"] = {"min": 2048, "max": 8192, "log": True}
    assert validate_spec(spec, limits=RUNS)["search"]["space"]["max_num_batched_tokens"]["min"] == 2048


def test_chunked_only_knobs_need_chunked_prefill_somewhere() -> None:
    spec = _spec()
    spec["search"]["space"]["enable_chunked_prefill"] = [False]
    spec["search"]["space"]["max_num_batched_tokens"] = [2048, 4096]
    spec["search"]["space"]["long_prefill_token_threshold"] = [128, 512]
    errors = _errors(spec)
    assert list(errors) == ["search.space.long_prefill_token_threshold"]
    assert "only acts with chunked prefill on" in errors["search.space.long_prefill_token_threshold"]
    spec["search"]["space"]["enable_chunked_prefill"] = [True, False]
    assert validate_spec(spec, limits=RUNS)["search"]["space"]["long_prefill_token_threshold"]


def test_a_space_of_one_config_is_refused() -> None:
    spec = _spec()
    spec["search"]["space"] = {"max_num_seqs": [8]}
    assert "holds one config only" in _errors(spec)["search.space"]


def test_the_grid_of_a_space_counts_log_ranges_by_doubling() -> None:
    assert range_values({"min": 256, "max": 4096, "log": True}) == [256, 512, 1024, 2048, 4096]
    assert range_values({"min": 300, "max": 1000, "log": True}) == [300, 600, 1000]
    assert range_values({"min": 2, "max": 4, "log": False}) == [2, 3, 4]
    space = validate_spec(_spec(), limits=RUNS)["search"]["space"]
    assert grid_points(space) == 5 * 3 * 2


def test_plan_size_counts_the_screening_trials_and_the_confirmed_cells() -> None:
    spec = validate_spec(_spec(budget={"max_trials": 20}, confirm=2), limits=RUNS)
    runs, _ = plan_size(spec)
    # B0 + 2 confirmed cells over 2 mixtures x 2 rates x 1 repeat, 20 trials, 1 rehearsal.
    assert runs == 3 * 2 * 2 * 1 + 20 + 1
    capped = validate_spec(_spec(budget={"max_trials": 20, "max_engine_hours": 0.01}, confirm=2), limits=RUNS)
    assert plan_size(capped)[1] < plan_size(spec)[1]


def test_a_search_written_back_validates_to_the_same_section() -> None:
    from apps.experiments.spec_search import search_as_written

    for given in (
        {},
        {"screening": {"mixture": "50-50", "rate": "low"}, "budget": {"max_engine_hours": 2.5}},
    ):
        spec = validate_spec(_spec(**given), limits=RUNS)
        again = _spec()
        again["search"] = search_as_written(spec["search"])
        assert validate_spec(again, limits=RUNS)["search"] == spec["search"]


def test_b0_may_not_take_a_trial_cells_id() -> None:
    spec = _spec()
    spec["baseline"]["id"] = "T3"
    assert "trial cells" in _errors(spec)["baseline.id"]
    spec["baseline"]["id"] = "T3b"  # not a trial's id
    assert validate_spec(spec, limits=RUNS)["baseline"]["id"] == "T3b"
    grid = copy.deepcopy(SMALL_SPEC)  # a grid has no trial cells
    grid["baseline"]["id"] = "T3"
    assert validate_spec(grid, limits=RUNS)["baseline"]["id"] == "T3"
