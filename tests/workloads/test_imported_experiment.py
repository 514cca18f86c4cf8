"""A real trace imported from the command line, then replayed by an experiment."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.experiments.models import Experiment
from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import SpecError
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_freeze_and_enqueue
from tests.experiments.factories import UserFactory, small_spec
from tests.runs.factories import make_host
from workers.engine.tinymodel import build_tokenizer

# Shipped in the repository (CC-BY-4.0, credit in examples/traces/README.md).
AZURE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("import-model"))


def _import(model_dir: Path, *extra: str) -> str:
    out = io.StringIO()
    call_command(
        "trace_import", str(AZURE), "--format", "azure", "--model-dir", str(model_dir),
        "--tokenizer-revision", "t1", "--max-model-len", "2048", "--busiest", "20", "--warmup", "2",
        *extra, stdout=out, stderr=io.StringIO(),
    )  # fmt: skip
    return out.getvalue().strip()


def _spec(model_dir: Path, sha: str) -> dict:
    spec = small_spec()
    spec["model"] = {**spec["model"], "path": str(model_dir)}
    spec["workload"] = {**spec["workload"], "arrival": {"process": "trace", "trace_sha256": sha}}
    return spec


@pytest.mark.django_db
def test_it_replays_an_imported_trace_in_every_run(model_dir: Path) -> None:
    assert AZURE.is_file(), f"the shipped Azure trace is missing: {AZURE}"
    sha = _import(model_dir)
    assert len(sha) == 64 and sha == _import(model_dir)  # the same file and options, the same bytes
    make_host()
    experiment = experiment_create(spec=_spec(model_dir, sha), owner=UserFactory())
    assert experiment_to_spec(experiment=experiment)["workload"]["arrival"] == {
        "process": "trace",
        "trace_sha256": sha,
    }
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    assert experiment_freeze_and_enqueue(experiment_id=experiment.pk) == 2
    assert set(experiment.runs.values_list("trace_sha256", flat=True)) == {sha}


@pytest.mark.django_db
def test_it_refuses_an_unknown_trace_or_classes_the_spec_lacks(model_dir: Path) -> None:
    assert AZURE.is_file(), f"the shipped Azure trace is missing: {AZURE}"
    owner = UserFactory()
    with pytest.raises(SpecError) as info:
        experiment_create(spec=_spec(model_dir, "ab" * 32), owner=owner)
    assert info.value.errors[0].path == "workload.arrival.trace_sha256"
    sha = _import(model_dir, "--classes", "tiny:200,medium:1000,huge")
    with pytest.raises(SpecError) as info:
        experiment_create(spec=_spec(model_dir, sha), owner=owner)
    assert info.value.errors[0].path == "classes" and "huge" in info.value.errors[0].message
    assert Experiment.objects.count() == 0


def test_it_names_a_bad_classes_option(model_dir: Path) -> None:
    assert AZURE.is_file(), f"the shipped Azure trace is missing: {AZURE}"
    with pytest.raises(CommandError, match="the last class must have no limit"):
        _import(model_dir, "--classes", "short:1024")
