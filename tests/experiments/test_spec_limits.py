"""Careless or hostile specs are field errors before anything expands, never a hang or a 500."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.experiments import spec as spec_module
from apps.experiments.models import Experiment
from apps.experiments.spec import SpecError, SpecLimits, dump_spec, parse_spec, plan_size, validate_spec
from tests.experiments.factories import SMALL_SPEC
from tests.ui.forms_data import form_data


def _errors(raw: Any, **kw: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_spec(raw, **kw)
    return {e.path: e.message for e in info.value.errors}


def _spec(**workload: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["workload"].update(workload)
    return spec


def test_it_refuses_two_million_repeats_without_expanding_the_plan(monkeypatch):
    def no_expansion(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the plan must not be expanded to refuse a spec")

    monkeypatch.setattr("apps.experiments.plan.expand_plan", no_expansion)
    errors = _errors(_spec(repeats=2_000_000))
    assert errors["workload.repeats"] == "must be at most 100, got 2000000"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["workload", "observation_s"], 10**7, "workload.observation_s"),
        (["workload", "rates", "low"], 1e9, "workload.rates.low"),
        (["controls", "max_model_len"], 10**9, "controls.max_model_len"),
        (["controls", "seed"], 10**30, "controls.seed"),
        (["classes", 0, "contract", "ttft_p99_ms"], 1e12, "classes[0].contract.ttft_p99_ms"),
        (["classes", 0, "priority"], 10**12, "classes[0].priority"),
        (["workload", "seed"], -1, "workload.seed"),
    ],
)
def test_it_bounds_every_number(path: list[Any], value: Any, field: str):
    spec = copy.deepcopy(SMALL_SPEC)
    target: Any = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert field in _errors(spec)


def test_it_names_a_huge_integer_by_its_size():
    assert _errors(_spec(repeats=10**40))["workload.repeats"] == "must be at most 100, got a 41-digit number"


def test_it_caps_the_runs_and_engine_hours_of_a_plan():
    spec = _spec(repeats=50)
    runs, hours = plan_size(validate_spec(spec))
    # + 1: the rollback rehearsal of the proposed cell (recovery.rehearse defaults to true)
    assert runs == 2 * len(spec["workload"]["mixtures"]) * len(spec["workload"]["rates"]) * 50 + 1
    errors = _errors(spec, limits=SpecLimits(max_runs=runs - 1))
    assert "TAILTUNE_MAX_RUNS" in errors["workload.repeats"]
    errors = _errors(spec, limits=SpecLimits(max_engine_hours=hours / 2))
    assert "TAILTUNE_MAX_ENGINE_HOURS" in errors["workload.observation_s"]


def test_it_caps_the_number_of_cells():
    spec = copy.deepcopy(SMALL_SPEC)
    spec["candidates"] = [
        {"id": f"C{i}", "args": {"max_num_seqs": 1 + i}} for i in range(spec_module.MAX_CELLS)
    ]
    assert "too many" in _errors(spec)["candidates"]


def test_it_refuses_a_yaml_alias_bomb_by_line():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    with pytest.raises(SpecError) as info:
        parse_spec(bomb)
    (error,) = info.value.errors
    assert error.path == "line 2" and "aliases" in error.message


def test_it_refuses_deep_nesting_and_oversized_text():
    with pytest.raises(SpecError, match="nested deeper than 32 levels"):
        parse_spec("a: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(SpecError, match="the limit is 1000000"):
        parse_spec("a: " + "x" * 1_000_001)


def test_it_reports_an_integer_python_will_not_convert():
    with pytest.raises(SpecError, match="cannot be read"):
        parse_spec("name: x\nworkload: {repeats: " + "9" * 5000 + "}\n")


def test_it_checks_controls_generation_like_everything_else():
    spec = copy.deepcopy(SMALL_SPEC)
    spec["controls"]["generation"] = {"temperature": "hot", "bogus": 1, "top_p": 2.0}
    errors = _errors(spec)
    assert errors["controls.generation.temperature"].startswith("must be a number")
    assert errors["controls.generation.bogus"] == "unknown field"
    assert errors["controls.generation.top_p"] == "must be at most 1.0, got 2.0"
    spec["controls"]["generation"] = {"temperature": 0, "ignore_eos": True, "seed": 7}
    assert validate_spec(spec)["controls"]["generation"] == {
        "temperature": 0.0,
        "seed": 7,
        "ignore_eos": True,
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"name: x\nrepeats: \xff\xfe\n", "not UTF-8"),
        (b"a: &a [1, 2]\nb: *a\n", "aliases"),
        (("a: " + "[" * 3000 + "]" * 3000).encode(), "nested deeper"),
    ],
    ids=["non-utf8", "alias", "deep"],
)
def test_it_answers_a_hostile_upload_with_a_field_error(client, author, body: bytes, message: str):
    client.force_login(author)
    upload = SimpleUploadedFile("bad.yaml", body, content_type="text/yaml")
    response = client.post("/experiments/new/", form_data(spec_file=upload))
    assert response.status_code == 400
    assert message in response.content.decode()
    assert Experiment.objects.count() == 0


@pytest.mark.django_db
def test_it_refuses_a_non_utf8_file_on_the_command_line(tmp_path: Path, admin_user: Any):
    path = tmp_path / "bad.yaml"
    path.write_bytes(dump_spec(SMALL_SPEC).encode() + b"# \xff\n")
    with pytest.raises(CommandError, match="not UTF-8"):
        call_command("experiment_import", str(path), "--owner", "admin")
    assert Experiment.objects.count() == 0


yaml_scalars = st.one_of(
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(section=st.sampled_from(sorted(SMALL_SPEC)), value=yaml_values)
def test_it_gives_a_field_error_or_a_spec_never_an_exception(section: str, value: Any):
    spec = copy.deepcopy(SMALL_SPEC)
    spec[section] = value
    try:
        validate_spec(spec)
    except SpecError as exc:
        assert exc.errors and all(e.path and e.message for e in exc.errors)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=300))
def test_it_parses_any_text_to_a_field_error_or_a_spec(text: str):
    try:
        parse_spec(text)
    except SpecError as exc:
        assert exc.errors
