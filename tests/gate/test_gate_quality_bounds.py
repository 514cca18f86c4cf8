"""The gate holds a class's validators to the spec's bounds: a gate file whose class carries a
schema that cannot be bounded is refused in the request, with the field in the gate file, before
any window is stored; ``manage.py gate`` refuses it the same way."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.experiments.models import Experiment, TraceUpload
from apps.workloads.models import Trace
from tests.experiments.factories import UserFactory
from tests.experiments.test_quality_bounds import chained_schema
from tests.gate.test_gate_api import AZURE, api_for, gate_file, model_dir, post_gate
from tests.runs.factories import make_host

__all__ = ["model_dir"]  # the module's fixture, shared
pytestmark = pytest.mark.django_db
FIELD = "spec.classes[0].quality.validators.json_schema"


def unbounded_gate_file(model_dir: Path) -> str:
    doc = yaml.safe_load(gate_file(model_dir))
    doc["classes"][0]["quality"] = {"validators": {"json_schema": chained_schema(12)}}
    return yaml.safe_dump(doc)


def test_the_gate_api_refuses_a_chained_ref_schema_before_storing_the_window(model_dir: Path) -> None:
    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    response = post_gate(api, spec=unbounded_gate_file(model_dir))
    assert response.status_code == 400, response.content
    (error,) = response.json()["errors"]
    assert error["field"] == FIELD and "#/$defs/l" in error["message"], error
    assert TraceUpload.objects.count() == 0 and Experiment.objects.count() == 0 and Trace.objects.count() == 0


def test_the_gate_command_refuses_it_too(model_dir: Path, tmp_path: Path) -> None:
    make_host()
    UserFactory(username="ci", roles=["experimenter"])
    spec = tmp_path / "gate.yaml"
    spec.write_text(unbounded_gate_file(model_dir))
    with pytest.raises(CommandError) as info:
        call_command(
            "gate", "--trace", str(AZURE), "--format", "azure", "--busiest", "20", "--spec", str(spec),
            "--owner", "ci", "--timeout", "1", "--poll", "0.5", stdout=io.StringIO(),
        )  # fmt: skip
    assert FIELD in str(info.value), info.value
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0
