"""Every bad spec is refused with an error naming its field; nothing is saved."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.experiments.models import Experiment, RequestClass, ServerConfig
from apps.experiments.spec import SpecError, dump_spec, parse_spec, validate_spec
from apps.runs.models import Run
from tests.experiments.factories import SMALL_SPEC


def _mutate(path: list[Any], value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    target: Any = spec
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return spec


_DELETE = object()

BAD_SPECS = [
    (
        "non-positive budget",
        ["baseline", "args", "max_num_batched_tokens"],
        0,
        "baseline.args.max_num_batched_tokens",
    ),
    ("negative seqs", ["candidates", 0, "args", "max_num_seqs"], -4, "candidates[0].args.max_num_seqs"),
    (
        "budget below context with chunking off",
        ["candidates", 0, "args"],
        {"max_num_batched_tokens": 512, "enable_chunked_prefill": False},
        "candidates[0].args.max_num_batched_tokens",
    ),
    ("duplicate cell id", ["candidates", 0, "id"], "B0", "candidates[0].id"),
    (
        "weights not summing to 1",
        ["workload", "mixtures", "80-20"],
        {"short": 0.7, "long": 0.2},
        "workload.mixtures.80-20",
    ),
    (
        "unknown class in mixture",
        ["workload", "mixtures", "80-20"],
        {"short": 0.8, "huge": 0.2},
        "workload.mixtures.80-20.huge",
    ),
    (
        "unknown vLLM flag",
        ["candidates", 0, "args", "swap_space"],
        16,
        "candidates[0].args.swap_space",
    ),
    (
        "denied vLLM flag",
        ["baseline", "args", "trust_remote_code"],
        True,
        "baseline.args.trust_remote_code",
    ),
    (
        "control in a cell",
        ["candidates", 0, "args", "max_model_len"],
        4096,
        "candidates[0].args.max_model_len",
    ),
    ("non-positive rate", ["workload", "rates", "low"], 0, "workload.rates.low"),
    ("zero repeats", ["workload", "repeats"], 0, "workload.repeats"),
    (
        "contract limit not a number",
        ["classes", 0, "contract", "ttft_p99_ms"],
        "fast",
        "classes[0].contract.ttft_p99_ms",
    ),
    ("error budget above 1", ["classes", 0, "contract", "error_rate"], 1.5, "classes[0].contract.error_rate"),
    (
        "bad scheduling policy",
        ["baseline", "args", "scheduling_policy"],
        "lifo",
        "baseline.args.scheduling_policy",
    ),
    ("gamma without cv", ["workload", "arrival"], {"process": "gamma"}, "workload.arrival.cv"),
    ("unknown arrival", ["workload", "arrival"], {"process": "bursty"}, "workload.arrival.process"),
    ("missing model revision", ["model", "revision"], _DELETE, "model.revision"),
    ("request larger than context", ["classes", 1, "input_tokens"], 4000, "classes[1].input_tokens"),
    ("unknown top-level key", ["grid"], {}, "grid"),
]


@pytest.mark.parametrize(("label", "path", "value", "field"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_it_names_the_field_of_each_bad_spec(label: str, path: list[Any], value: Any, field: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(_mutate(path, value))
    paths = [e.path for e in info.value.errors]
    assert field in paths, f"{label}: expected an error at {field}, got {info.value.errors}"


def test_it_accepts_the_small_spec_and_the_seed_example(seed_spec_text: str) -> None:
    assert validate_spec(copy.deepcopy(SMALL_SPEC))["name"] == "small"
    spec = parse_spec(seed_spec_text)
    assert len(spec["candidates"]) == 6
    assert parse_spec(dump_spec(spec)) == spec


def test_it_reports_the_line_of_broken_yaml() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec("name: x\nmodel: [unclosed\n")
    assert info.value.errors[0].path.startswith("line ")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("label", "path", "value", "field"), BAD_SPECS[:6], ids=[b[0] for b in BAD_SPECS[:6]]
)
def test_it_exits_nonzero_and_saves_nothing_from_the_command(
    tmp_path, admin_user, label: str, path: list[Any], value: Any, field: str
) -> None:
    spec = _mutate(path, value)
    spec["owner"] = "admin"
    file = tmp_path / "bad.yaml"
    file.write_text(dump_spec(spec))
    with pytest.raises(CommandError) as info:
        call_command("experiment_import", str(file), "--owner", "admin")
    assert field in str(info.value)
    assert Experiment.objects.count() == 0
    assert ServerConfig.objects.count() == 0
    assert RequestClass.objects.count() == 0
    assert Run.objects.count() == 0


@pytest.mark.django_db
def test_it_names_an_unknown_owner(tmp_path) -> None:
    spec = copy.deepcopy(SMALL_SPEC)
    file = tmp_path / "spec.yaml"
    file.write_text(dump_spec(spec))
    with pytest.raises(CommandError, match="--owner: no user named 'nobody'"):
        call_command("experiment_import", str(file), "--owner", "nobody")
    assert Experiment.objects.count() == 0


@pytest.mark.django_db
def test_it_never_takes_the_author_from_the_file(tmp_path, admin_user) -> None:
    # The file names a user; without --owner that name could make anyone the author (and so
    # keep them from approving, or let a colleague's name stand for one's own work).
    spec = copy.deepcopy(SMALL_SPEC)
    spec["owner"] = "admin"
    file = tmp_path / "spec.yaml"
    file.write_text(dump_spec(spec))
    with pytest.raises(CommandError, match="--owner"):
        call_command("experiment_import", str(file))
    assert Experiment.objects.count() == 0


def test_it_validates_the_analysis_options() -> None:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["analysis"] = {"agreed_rates": ["low"], "compare": {"resamples": 3000, "seed": 3}}
    assert validate_spec(spec)["analysis"]["agreed_rates"] == ["low"]
    spec["analysis"] = {"agreed_rates": ["peak"], "bogus": 1}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    paths = [e.path for e in info.value.errors]
    assert "analysis.agreed_rates[0]" in paths and "analysis" in paths
    # Not a list of names: a field error, never a crash.
    for bad, where in (
        (3, "analysis.agreed_rates"),
        ([{"low": 1}], "analysis.agreed_rates[0]"),
        ([7], "analysis.agreed_rates[0]"),
    ):
        spec["analysis"] = {"agreed_rates": bad}
        with pytest.raises(SpecError) as info:
            validate_spec(spec)
        assert [e.path for e in info.value.errors] == [where]


def test_it_takes_a_pool_headroom_and_names_the_field_when_it_is_wrong() -> None:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["analysis"] = {"pool_headroom": 0.3}
    assert validate_spec(spec)["analysis"]["pool_headroom"] == 0.3
    spec["analysis"] = {}
    assert validate_spec(spec)["analysis"]["pool_headroom"] == 0.2  # the default, stated
    for bad in (1, 1.2, -0.1, "20%", True):
        spec["analysis"] = {"pool_headroom": bad}
        with pytest.raises(SpecError) as info:
            validate_spec(spec)
        assert [e.path for e in info.value.errors] == ["analysis.pool_headroom"], bad
        assert "from 0 up to, not including, 1" in info.value.errors[0].message


def test_it_takes_a_primary_metric_per_class_and_refuses_an_unknown_one() -> None:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["classes"][0]["primary_metric"] = "e2e_p99_ms"
    assert validate_spec(spec)["classes"][0]["primary_metric"] == "e2e_p99_ms"
    assert "primary_metric" not in validate_spec(copy.deepcopy(SMALL_SPEC))["classes"][0]
    spec["classes"][0]["primary_metric"] = "goodput"
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert [e.path for e in info.value.errors] == ["classes[0].primary_metric"]


def test_it_refuses_fewer_than_2000_bootstrap_draws() -> None:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["analysis"] = {"compare": {"resamples": 200}}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert any("resamples must be at least 2000" in e.message for e in info.value.errors)
