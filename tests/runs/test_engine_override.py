"""A candidate that is another engine build or model revision: the spec, the host's engines and the run."""

from __future__ import annotations

import pytest

from apps.experiments.services import experiment_to_spec
from apps.experiments.spec import SpecError, validate_spec
from apps.lifecycle.creation import experiment_create
from apps.runs.hosts import _engines
from tests.experiments.factories import UserFactory, small_spec
from tests.runs.factories import make_host
from workers.pipeline import EngineUnavailable, host_config, run_controls


def spec_with(engine: object) -> dict:
    spec = small_spec()
    spec["candidates"] = [{**spec["candidates"][0], "engine": engine}]
    return spec


@pytest.mark.parametrize(
    ("engine", "field"),
    [
        ({}, "candidates[0].engine"),
        ({"image": "x", "flavour": "y"}, "candidates[0].engine.flavour"),
        ({"model_revision": ["a"]}, "candidates[0].engine.model_revision"),
        ("vllm:v0.33", "candidates[0].engine"),
    ],
)
def test_a_bad_engine_override_is_a_field_error(engine: object, field: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(spec_with(engine))
    assert field in {e.path for e in info.value.errors}


@pytest.mark.django_db
def test_the_override_round_trips_and_reaches_the_launcher() -> None:
    experiment = experiment_create(
        spec=spec_with({"image": "vllm/vllm-openai:v0.33.0", "model_revision": "rev-2"}), owner=UserFactory()
    )
    assert experiment_to_spec(experiment=experiment)["candidates"][0]["engine"] == {
        "image": "vllm/vllm-openai:v0.33.0",
        "model_revision": "rev-2",
    }
    b0, c1 = experiment.cells.order_by("position")
    assert run_controls(experiment, b0)["revision"] == experiment.model_revision
    assert run_controls(experiment, c1)["revision"] == "rev-2"
    plain = make_host("plain")
    assert host_config(plain, b0).vllm_command == ("vllm", "serve")
    with pytest.raises(EngineUnavailable, match="no engine for image 'vllm/vllm-openai:v0.33.0'"):
        host_config(plain, c1)
    both = make_host(
        "both", engines={"vllm/vllm-openai:v0.33.0": ["docker", "run", "vllm/vllm-openai:v0.33.0"]}
    )
    assert host_config(both, c1).vllm_command == ("docker", "run", "vllm/vllm-openai:v0.33.0")
    assert host_config(both, b0).vllm_command == ("vllm", "serve")


@pytest.mark.django_db
def test_a_run_whose_host_lacks_the_engine_fails_before_starting_and_says_why(settings) -> None:
    from apps.experiments.models import Experiment
    from apps.runs.models import Run
    from workers.pipeline import run_execute

    experiment = experiment_create(spec=spec_with({"image": "vllm:v9"}), owner=UserFactory())
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    host = make_host(settings.TAILTUNE_HOST)
    run = experiment.runs.get(cell__cell_id="C1")
    Run.objects.filter(pk=run.pk).update(host=host, trace_sha256="a" * 64)
    assert run_execute(run_pk=run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == "failed" and "no engine for image 'vllm:v9'" in run.reason


def test_the_worker_reads_its_engines_and_refuses_a_malformed_list() -> None:
    assert _engines('{"vllm:v0.33": ["vllm", "serve"]}') == {"vllm:v0.33": ["vllm", "serve"]}
    assert _engines("") == {}
    for bad in ("[1]", '{"a": "vllm serve"}', '{"a": []}', "{"):
        with pytest.raises(ValueError, match="TAILTUNE_VLLM_COMMANDS"):
            _engines(bad)


@pytest.mark.django_db
def test_a_run_whose_trace_pins_another_tokenizer_fails_before_starting_and_names_both(settings) -> None:
    from apps.experiments.models import Experiment
    from apps.runs.models import Run
    from apps.workloads.models import Trace
    from workers.pipeline import run_execute

    experiment = experiment_create(spec=small_spec(), owner=UserFactory())
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    host = make_host(settings.TAILTUNE_HOST)
    run = experiment.runs.get(cell__cell_id="C1")
    # A trace made with another tokenizer.json than the one this host's model directory holds.
    trace = Trace.objects.create(
        sha256="e" * 64, corpus_sha256="", requests=1, duration_s=1.0, content_gz=b"",
        meta={"tokenizer_sha256": "f" * 64},
    )  # fmt: skip
    Run.objects.filter(pk=run.pk).update(host=host, trace=trace, trace_sha256=trace.sha256)
    assert run_execute(run_pk=run.pk) == "failed"
    run.refresh_from_db()
    assert run.reason.startswith("refused before start: the trace's prompts were made with tokenizer.json")
    assert "f" * 16 in run.reason
