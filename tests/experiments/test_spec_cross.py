"""The spec's cross-checks (apps/experiments/spec_cross.py, issue #34 item 6): a wrong sweep is a
field error naming the field before anything runs, and nothing is saved."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.experiments.models import Experiment, RequestClass, ServerConfig
from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import SpecError, dump_spec, validate_spec
from apps.experiments.spec_cross import PARSER_DEFAULTS, effective_config
from apps.runs.models import Run
from tests.experiments.factories import SMALL_SPEC, make_experiment


def _spec() -> dict[str, Any]:
    return copy.deepcopy(SMALL_SPEC)


def _errors(spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    return {e.path: e.message for e in info.value.errors}


# --- 1. a class priority under fcfs -------------------------------------------------------------


def test_a_priority_under_vllms_default_fcfs_names_the_class_and_every_cell() -> None:
    spec = _spec()
    spec["classes"][1]["priority"] = 2
    errors = _errors(spec)
    assert list(errors) == ["classes[1].priority"]
    message = errors["classes[1].priority"]
    assert message.startswith("is 2, but cells B0 (scheduling_policy: fcfs by vLLM's default), C1 ")
    assert "scheduling_policy: priority" in message


def test_one_fcfs_cell_among_priority_cells_is_the_one_named() -> None:
    spec = _spec()
    spec["classes"][1]["priority"] = 1
    spec["baseline"]["args"]["scheduling_policy"] = "priority"
    spec["candidates"][0]["args"]["scheduling_policy"] = "fcfs"
    errors = _errors(spec)
    assert list(errors) == ["classes[1].priority"]
    assert "cell C1 (scheduling_policy: fcfs)" in errors["classes[1].priority"]
    assert "B0" not in errors["classes[1].priority"]


def test_priorities_pass_when_every_cell_schedules_by_priority_and_zero_passes_under_fcfs() -> None:
    spec = _spec()
    spec["classes"][1]["priority"] = 1
    for cell in (spec["baseline"], *spec["candidates"]):
        cell["args"]["scheduling_policy"] = "priority"
    assert validate_spec(spec)["classes"][1]["priority"] == 1
    assert validate_spec(_spec())["classes"][1]["priority"] == 0  # fcfs, every priority 0


# --- 2. two cells with one effective config; the A/A control -------------------------------------


def test_a_candidate_equal_to_b0_after_vllms_defaults_is_refused_unless_marked_control() -> None:
    spec = _spec()
    # B0 leaves these out: vLLM's parser defaults (the pinned version's catalogue).
    defaults = {"scheduling_policy": "fcfs", "long_prefill_token_threshold": 0, "kv_cache_dtype": "auto"}
    assert {k: PARSER_DEFAULTS[k] for k in defaults} == defaults
    spec["candidates"].append({"id": "AA", "args": {**spec["baseline"]["args"], "scheduling_policy": "fcfs"}})
    spec["candidates"][1]["args"]["kv_cache_dtype"] = "auto"
    errors = _errors(spec)
    assert list(errors) == ["candidates[1].args"]
    assert "same effective config as B0" in errors["candidates[1].args"]
    assert "control: true" in errors["candidates[1].args"]
    spec["candidates"][1]["control"] = True
    normalised = validate_spec(spec)
    assert normalised["candidates"][1]["control"] is True
    assert "control" not in normalised["candidates"][0]


def test_a_float_budget_equal_to_an_int_is_one_config() -> None:
    assert effective_config({"max_num_batched_tokens": 2048.0}) == effective_config(
        {"max_num_batched_tokens": 2048}
    )
    # A flag whose default vLLM resolves at start-up counts as different when set.
    assert effective_config({}) != effective_config({"max_num_seqs": 256})


def test_two_candidates_with_one_config_name_the_first() -> None:
    spec = _spec()
    spec["candidates"].append({"id": "C2", "args": dict(spec["candidates"][0]["args"])})
    errors = _errors(spec)
    assert list(errors) == ["candidates[1].args"]
    assert "same effective config as candidates[0] (C1)" in errors["candidates[1].args"]
    # A control mark does not make a copy of a candidate legal: a control is B0's config.
    spec["candidates"][1]["control"] = True
    errors = _errors(spec)
    assert list(errors) == ["candidates[1].control"]
    assert "max_num_batched_tokens 512 (B0: 2048)" in errors["candidates[1].control"]


def test_another_engine_is_another_config_and_no_control() -> None:
    spec = _spec()
    spec["candidates"].append(
        {"id": "IMG", "args": dict(spec["baseline"]["args"]), "engine": {"image": "vllm:next"}}
    )
    assert validate_spec(spec)["candidates"][1]["engine"] == {"image": "vllm:next"}
    spec["candidates"][1]["control"] = True
    errors = _errors(spec)
    assert list(errors) == ["candidates[1].control"]
    assert "engine.image 'vllm:next' (B0: unset)" in errors["candidates[1].control"]


def test_a_cell_with_its_own_errors_is_not_compared() -> None:
    spec = _spec()
    spec["candidates"].append({"id": "C2", "args": {**spec["baseline"]["args"], "max_num_seqs": -1}})
    errors = _errors(spec)
    assert list(errors) == ["candidates[1].args.max_num_seqs"]


def test_control_must_be_a_boolean() -> None:
    spec = _spec()
    spec["candidates"][0]["control"] = "yes"
    assert "candidates[0].control" in _errors(spec)


# --- 3. a budget below the longest class's prompt with chunked prefill off ------------------------


def test_a_budget_below_the_longest_prompt_with_chunking_off_names_the_class() -> None:
    spec = _spec()
    spec["candidates"][0]["args"] = {"max_num_batched_tokens": 512, "enable_chunked_prefill": False}
    # Without a valid max_model_len the budget's own check cannot speak: this one does.
    spec["controls"]["max_model_len"] = "long"
    errors = _errors(spec)
    message = errors["candidates[0].args.max_num_batched_tokens"]
    assert message.startswith("512 is below class long's prompt (1024 input tokens) with chunked prefill off")


def test_the_budget_is_named_once_when_max_model_len_already_refuses_it() -> None:
    spec = _spec()
    spec["candidates"][0]["args"] = {"max_num_batched_tokens": 512, "enable_chunked_prefill": False}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    paths = [e.path for e in info.value.errors]
    assert paths == ["candidates[0].args.max_num_batched_tokens"]
    assert "max_model_len" in info.value.errors[0].message


def test_a_budget_that_holds_the_longest_prompt_or_chunking_on_passes() -> None:
    spec = _spec()
    spec["controls"]["max_model_len"] = 1100
    spec["classes"][1]["input_tokens"] = 1024
    spec["classes"][1]["output_tokens"] = 8
    spec["candidates"][0]["args"] = {"max_num_batched_tokens": 1100, "enable_chunked_prefill": False}
    validate_spec(spec)
    spec["candidates"][0]["args"] = {"max_num_batched_tokens": 512, "enable_chunked_prefill": True}
    validate_spec(spec)


# --- the command saves nothing; the control round-trips -------------------------------------------


def _priority_under_fcfs() -> dict[str, Any]:
    spec = _spec()
    spec["classes"][1]["priority"] = 3
    return spec


def _copy_of_b0() -> dict[str, Any]:
    spec = _spec()
    spec["candidates"].append({"id": "AA", "args": dict(spec["baseline"]["args"])})
    return spec


def _control_not_b0() -> dict[str, Any]:
    spec = _spec()
    spec["candidates"][0]["control"] = True
    return spec


def _budget_below_prompt() -> dict[str, Any]:
    spec = _spec()
    spec["baseline"]["args"] = {"max_num_batched_tokens": 256, "enable_chunked_prefill": False}
    spec["controls"]["max_model_len"] = 0
    return spec


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("build", "field", "words"),
    [
        (_priority_under_fcfs, "classes[1].priority", "first-come-first-served"),
        (_copy_of_b0, "candidates[1].args", "same effective config as B0"),
        (_control_not_b0, "candidates[0].control", "not B0's configuration run again"),
        (_budget_below_prompt, "baseline.args.max_num_batched_tokens", "below class long's prompt"),
    ],
    ids=["priority-under-fcfs", "copy-of-b0", "control-not-b0", "budget-below-prompt"],
)
def test_experiment_import_names_the_field_and_leaves_the_database_unchanged(
    tmp_path, admin_user, build, field: str, words: str
) -> None:  # type: ignore[no-untyped-def]
    make_experiment(owner=admin_user)  # something already there, to see that it stays as it was
    before = (Experiment.objects.count(), ServerConfig.objects.count(), RequestClass.objects.count())
    runs_before = Run.objects.count()
    file = tmp_path / "bad.yaml"
    file.write_text(dump_spec(build()))
    with pytest.raises(CommandError) as info:
        call_command("experiment_import", str(file), "--owner", "admin")
    assert f"{field}: " in str(info.value) and words in str(info.value)
    assert (Experiment.objects.count(), ServerConfig.objects.count(), RequestClass.objects.count()) == before
    assert Run.objects.count() == runs_before


@pytest.mark.django_db
def test_the_aa_cell_is_planned_like_every_cell_and_exported_as_a_control(admin_user) -> None:  # type: ignore[no-untyped-def]
    spec = _spec()
    spec["workload"]["repeats"] = 2
    spec["candidates"].append({"id": "AA", "args": dict(spec["baseline"]["args"]), "control": True})
    experiment = make_experiment(owner=admin_user, **{k: spec[k] for k in ("candidates", "workload")})
    cells = {c.cell_id: c for c in experiment.cells.all()}
    assert cells["AA"].control is True and not cells["C1"].control and not cells["B0"].control
    # Every cell once in every (mixture, rate, repeat) round, the A/A cell too.
    sweep = experiment.runs.filter(kind=Run.Kind.SWEEP)
    per_cell = {cid: sweep.filter(cell__cell_id=cid).count() for cid in cells}
    assert per_cell == {"B0": 2, "C1": 2, "AA": 2}
    for repeat in (1, 2):
        assert sorted(sweep.filter(repeat=repeat).values_list("cell__cell_id", flat=True)) == [
            "AA",
            "B0",
            "C1",
        ]
    exported = experiment_to_spec(experiment=experiment)
    assert exported["candidates"][1] == {"id": "AA", "args": spec["baseline"]["args"], "control": True}
    assert "control" not in exported["candidates"][0]
    assert validate_spec(exported)["candidates"][1]["control"] is True


def test_a_policy_that_is_not_one_is_reported_once_where_it_is() -> None:
    spec = _spec()
    spec["classes"][1]["priority"] = 1
    for cell in (spec["baseline"], *spec["candidates"]):
        cell["args"]["scheduling_policy"] = "priority"
    spec["candidates"][0]["args"]["scheduling_policy"] = "lottery"
    assert list(_errors(spec)) == ["candidates[0].args.scheduling_policy"]
