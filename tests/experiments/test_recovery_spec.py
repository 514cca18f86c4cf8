"""The spec's recovery section: field errors for bad rehearsals, nothing saved."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.experiments.models import Experiment
from apps.experiments.recovery import recovery_options
from apps.experiments.spec import SpecError, dump_spec, plan_size, validate_spec
from apps.runs.models import Run
from tests.experiments.factories import SMALL_SPEC


def _with(recovery: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["recovery"] = recovery
    return spec


def _errors(recovery: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_spec(_with(recovery))
    return {e.path: e.message for e in info.value.errors}


def test_defaults_rehearse_warm_at_mid_observation():
    spec = validate_spec(copy.deepcopy(SMALL_SPEC))
    options = recovery_options(spec)
    w = spec["workload"]
    assert options["rehearse"] is True and options["standby"] == "warm"
    assert options["switch_at_s"] == w["warmup_s"] + w["observation_s"] / 2
    assert options["max_recovery_s"] == 60.0


@pytest.mark.parametrize(
    ("recovery", "field", "words"),
    [
        ({"switch_at_s": 10_000}, "recovery.switch_at_s", "after the end of the trace"),
        ({"standby": "lukewarm"}, "recovery.standby", "must be one of warm, cold"),
        ({"switch": "to-b0"}, "recovery.router", "is required"),
        ({"router": "prod"}, "recovery.switch", "is required"),
        ({"switch": "to b0; reboot", "router": "prod"}, "recovery.switch", "TAILTUNE_SWITCH_COMMANDS"),
        ({"switch": "to-b0", "router": ["http://r:1"]}, "recovery.router", "TAILTUNE_ROUTERS"),
        ({"max_recovery_s": -1}, "recovery.max_recovery_s", "positive"),
        ({"ports": {"candidate": 9000, "b0": 9000}}, "recovery.ports.b0", "differ"),
        ({"mixture": "nope"}, "recovery.mixture", "unknown mixture"),
        ({"surprise": 1}, "recovery.surprise", "unknown field"),
        ({"rehearse": "yes"}, "recovery.rehearse", "true or false"),
    ],
)
def test_bad_recovery_fields_are_named(recovery, field, words):
    errors = _errors(recovery)
    assert field in errors, errors
    assert words in errors[field]


@pytest.mark.django_db
def test_a_bad_recovery_spec_saves_nothing(tmp_path, admin_user):
    spec = _with({"standby": "tepid"})
    file = tmp_path / "bad.yaml"
    file.write_text(dump_spec(spec))
    with pytest.raises(CommandError, match="recovery.standby"):
        call_command("experiment_import", str(file), "--owner", "admin")
    assert Experiment.objects.count() == 0 and Run.objects.count() == 0


def test_a_router_spec_round_trips_and_the_rehearsal_is_in_the_plan_size():
    good = {"standby": "cold", "switch": "to-b0", "router": "prod", "max_recovery_s": 30}
    spec = validate_spec(_with(good))
    assert spec["recovery"]["switch"] == "to-b0" and spec["recovery"]["router"] == "prod"
    assert validate_spec(spec) == spec
    off = validate_spec(_with({"rehearse": False}))
    runs_on, hours_on = plan_size(spec)
    runs_off, hours_off = plan_size(off)
    assert runs_on == runs_off + 1 and hours_on > hours_off


@pytest.mark.parametrize(
    ("recovery", "field", "setting"),
    [
        (
            {"switch_command": ["touch", "/tmp/x"], "route_url": "http://r:1"},
            "recovery.switch_command",
            "TAILTUNE_SWITCH_COMMANDS",
        ),
        (
            {"switch_command": "curl -X POST http://router/switch", "route_url": "http://r:1"},
            "recovery.switch_command",
            "TAILTUNE_SWITCH_COMMANDS",
        ),
        (
            {"switch_command": ["curl", "x"], "route_url": "http://10.0.0.1:8000"},
            "recovery.route_url",
            "TAILTUNE_ROUTERS",
        ),
        ({"backend_header": "X-Served-By"}, "recovery.backend_header", "TAILTUNE_ROUTERS"),
    ],
)
def test_a_spec_that_names_a_program_or_a_url_is_refused_with_the_setting_that_replaces_it(
    recovery, field, setting
):
    """The operator names what a host may run and reach; the spec only picks a name."""
    errors = _errors(recovery)
    assert field in errors, errors
    assert setting in errors[field]


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("name",), "x" * 201, "at most 200"),
        (("name",), "a\x00b", "plain text"),
        (("name",), "\ud800", "plain text"),
        (("baseline", "id"), "B" * 33, "at most 32"),
    ],
)
def test_text_the_database_cannot_store_is_a_field_error(path, value, words):
    spec = copy.deepcopy(SMALL_SPEC)
    target = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    messages = {e.path: e.message for e in info.value.errors}
    assert words in messages[".".join(path)]
