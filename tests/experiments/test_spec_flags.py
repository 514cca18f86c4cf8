"""Every flag production has (#34 item 2): a cell carries any flag of vLLM's own parser that is not
denied; a denied one is a field error naming the flag and why, and nothing is saved."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.experiments.models import Experiment, ServerConfig
from apps.experiments.spec import SpecError, dump_spec, parse_spec, validate_spec
from tests.experiments.factories import SMALL_SPEC

PRODUCTION = {"max_num_batched_tokens": 2048, "max_num_seqs": 8, "kv_cache_dtype": "fp8", "block_size": 16}


def _spec(baseline: dict[str, Any], *candidates: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["baseline"]["args"] = baseline
    spec["candidates"] = [{"id": f"C{i + 1}", "args": args} for i, args in enumerate(candidates)]
    return spec


def _errors(spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    return {e.path: e.message for e in info.value.errors}


def test_flags_production_sets_pass_through_and_every_candidate_keeps_b0s() -> None:
    spec = validate_spec(
        _spec(
            {**PRODUCTION, "enforce_eager": True, "compilation_config": {"cudagraph_capture_sizes": [1, 2]}},
            {"max_num_batched_tokens": 512, "max_num_seqs": 8},
            {"max_num_batched_tokens": 512, "block_size": 32},
        )
    )
    assert spec["baseline"]["args"]["kv_cache_dtype"] == "fp8"
    first, second = (c["args"] for c in spec["candidates"])
    # B0's flags that a sweep does not vary are every cell's, unless the cell sets its own ...
    assert first == {
        "kv_cache_dtype": "fp8",
        "block_size": 16,
        "enforce_eager": True,
        "compilation_config": {"cudagraph_capture_sizes": [1, 2]},
        "max_num_batched_tokens": 512,
        "max_num_seqs": 8,
    }
    assert second["block_size"] == 32 and second["kv_cache_dtype"] == "fp8"
    # ... while the scheduler flags stay each cell's own (the second sets no max_num_seqs).
    assert "max_num_seqs" not in second
    # The spec round-trips through YAML with every flag.
    assert parse_spec(dump_spec(spec)) == spec


def test_a_denied_flag_is_a_field_error_naming_it_and_why() -> None:
    errors = _errors(_spec({**PRODUCTION, "trust_remote_code": True}, {"chat_template": "/etc/passwd"}))
    assert errors["baseline.args.trust_remote_code"] == (
        "is denied: it runs Python code that comes with the model repository (its configuration and "
        "modelling files)"
    )
    assert errors["candidates[0].args.chat_template"].startswith(
        "is denied: it reads a file from a path on the host, outside the model roots"
    )


def test_an_unknown_flag_a_bad_value_and_a_control_are_each_named() -> None:
    errors = _errors(
        _spec(
            {**PRODUCTION, "swap_space": 16, "kv_cache_dtype": "fp9"},
            {"max_model_len": 1024, "max_num_seq": 4, "revision": "main"},
        )
    )
    assert errors["baseline.args.swap_space"] == "is not a flag of vLLM 0.32.0's server"
    assert errors["baseline.args.kv_cache_dtype"].startswith("must be one of auto, bfloat16")
    assert errors["candidates[0].args.max_model_len"] == (
        "is a frozen control: set it once under controls, not per cell"
    )
    assert "(did you mean max_num_seqs" in errors["candidates[0].args.max_num_seq"]
    assert (
        errors["candidates[0].args.revision"]
        == "is denied: it is set by tailtune's launcher from model.revision"
    )


@pytest.mark.django_db
def test_a_denied_flag_is_a_field_error_naming_it_and_why_and_nothing_is_saved(tmp_path, admin_user) -> None:
    spec = _spec({**PRODUCTION, "trust_remote_code": True}, {"max_num_batched_tokens": 512})
    spec["owner"] = "admin"
    file = tmp_path / "spec.yaml"
    file.write_text(dump_spec(spec))
    with pytest.raises(CommandError) as info:
        call_command("experiment_import", str(file), "--owner", "admin")
    assert "baseline.args.trust_remote_code: is denied: it runs Python code" in str(info.value)
    assert Experiment.objects.count() == 0 and ServerConfig.objects.count() == 0
