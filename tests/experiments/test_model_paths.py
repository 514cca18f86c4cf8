"""A spec's model path lies under the hosts' model roots (TAILTUNE_MODEL_ROOTS): ``..`` and a path
outside the roots are field errors through the service, the API and experiment_import alike,
nothing is saved, and the answer for a path outside is the same whether it exists or not."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.experiments.models import Experiment
from apps.experiments.spec import SpecError, dump_spec, validate_spec
from apps.lifecycle.creation import experiment_create
from apps.runs.models import Host, Run
from tests.experiments.factories import SMALL_SPEC


def _spec(path: str) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["model"]["path"] = path
    return spec


def _refusal(spec: dict[str, Any], owner: Any) -> str:
    before = (Experiment.objects.count(), Run.objects.count())
    with pytest.raises(SpecError) as info:
        experiment_create(spec=spec, owner=owner)
    found = {e.path: e.message for e in info.value.errors}
    assert list(found) == ["model.path"], found
    assert (Experiment.objects.count(), Run.objects.count()) == before  # nothing saved
    return found["model.path"]


@pytest.fixture
def roots(settings, tmp_path: Path) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    """One model root holding a model and a link that leads out of it; a directory outside."""
    root = tmp_path / "models"
    (root / "tiny").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    (outside / "secrets").mkdir(parents=True)
    (root / "escape").symlink_to(outside)
    settings.TAILTUNE_MODEL_ROOTS = [str(root)]
    return {"root": root, "outside": outside}


def test_a_parent_component_in_the_model_path_is_a_field_error() -> None:
    for path in ("../models/tiny", "/models/../etc", ".engine/models/tiny-llama/../../.."):
        with pytest.raises(SpecError) as info:
            validate_spec(_spec(path))
        assert [(e.path, "'..'" in e.message) for e in info.value.errors] == [("model.path", True)]


@pytest.mark.django_db
def test_a_path_outside_the_roots_is_refused_alike_whether_it_exists_or_not(author, roots) -> None:  # type: ignore[no-untyped-def]
    exists = _refusal(_spec(str(roots["outside"] / "secrets")), author)
    missing = _refusal(_spec(str(roots["outside"] / "no-such-dir")), author)
    through_a_link = _refusal(_spec(str(roots["root"] / "escape" / "secrets")), author)
    assert exists == missing == through_a_link
    assert str(roots["root"]) in exists and "TAILTUNE_MODEL_ROOTS" in exists
    assert "secrets" not in exists and "elsewhere" not in exists
    assert "'..'" in _refusal(_spec(str(roots["root"] / ".." / "elsewhere")), author)


@pytest.mark.django_db
def test_a_path_under_the_roots_or_a_hosts_registered_roots_is_accepted(author, roots, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert experiment_create(spec=_spec(str(roots["root"] / "tiny")), owner=author).model_path.endswith(
        "tiny"
    )
    gpu_models = tmp_path / "gpu-models"
    _refusal(_spec(str(gpu_models / "llama")), author)
    Host.objects.create(name="gpu-a", queue="host.gpu-a", model_roots=[str(gpu_models)])
    assert experiment_create(spec=_spec(str(gpu_models / "llama")), owner=author).pk
    Host.objects.filter(name="gpu-a").update(enabled=False)  # a disabled host offers nothing
    with pytest.raises(SpecError, match="model.path"):
        experiment_create(spec=_spec(str(gpu_models / "llama")), owner=author)


@pytest.mark.django_db
def test_the_api_and_experiment_import_refuse_it_with_the_same_field_error(author, roots, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, plaintext = token_create(user=author, name="test")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    messages = []
    for path in (roots["outside"] / "secrets", roots["outside"] / "no-such-dir"):
        body = dump_spec(_spec(str(path)))
        response = api.post("/api/v1/experiments", data=body, content_type="application/yaml")
        assert response.status_code == 400, response.content
        errors = response.json()["errors"]
        assert [e["field"] for e in errors] == ["model.path"]
        messages.append(errors[0]["message"])
        spec_file = tmp_path / "spec.yaml"
        spec_file.write_text(body)
        with pytest.raises(CommandError) as refused:
            call_command("experiment_import", str(spec_file), "--owner", author.username)
        assert f"model.path: {messages[-1]}" in str(refused.value) and "nothing saved" in str(refused.value)
    assert messages[0] == messages[1]
    assert Experiment.objects.count() == 0


@pytest.mark.django_db
def test_the_trace_api_refuses_a_model_dir_outside_the_roots_alike(author, roots) -> None:  # type: ignore[no-untyped-def]
    from apps.workloads.models import Trace

    (roots["outside"] / "secrets" / "tokenizer.json").write_text("{}")
    _, plaintext = token_create(user=author, name="test")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    answers = []
    for model_dir in (roots["outside"] / "secrets", roots["outside"] / "no-such-dir"):
        response = api.post(
            "/api/v1/traces",
            {
                "format": "azure",
                "model_dir": str(model_dir),
                "tokenizer_revision": "tiny-v1",
                "max_model_len": "2048",
                "classes": "short:1024,long",
                "file": SimpleUploadedFile("a.csv", b"x"),
            },
            format="multipart",
        )
        assert response.status_code == 400, response.content
        errors = response.json()["errors"]
        assert [e["field"] for e in errors] == ["model_dir"]
        answers.append(errors[0]["message"].replace(str(model_dir), "<dir>"))
    assert answers[0] == answers[1] and "model roots" in answers[0]
    assert Trace.objects.count() == 0


@pytest.mark.django_db
def test_trace_import_refuses_a_model_dir_outside_the_roots(roots) -> None:  # type: ignore[no-untyped-def]
    fixture = Path(__file__).resolve().parents[1] / "workloads" / "fixtures" / "azure_2024.csv"
    for model_dir in (roots["outside"] / "secrets", roots["outside"] / "no-such-dir"):
        with pytest.raises(CommandError, match="--model-dir: must be a model directory under"):
            call_command(
                "trace_import", str(fixture), "--format", "azure", "--model-dir", str(model_dir),
                "--tokenizer-revision", "t", "--max-model-len", "2048",
            )  # fmt: skip


@pytest.mark.django_db
def test_a_host_registers_its_own_model_roots(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from apps.runs.hosts import host_register_local

    settings.TAILTUNE_MODEL_ROOTS = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert host_register_local().model_roots == [str(tmp_path / "a"), str(tmp_path / "b")]


def test_the_roots_setting_takes_a_json_or_path_list_and_names_itself_when_bad(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from config.env import ImproperEnv, envpaths

    monkeypatch.setenv("X_ROOTS", '["/models", "/data/hf/"]')
    assert envpaths("X_ROOTS", []) == ["/models", "/data/hf"]
    monkeypatch.setenv("X_ROOTS", "/models:/data/hf")
    assert envpaths("X_ROOTS", []) == ["/models", "/data/hf"]
    monkeypatch.delenv("X_ROOTS")
    assert envpaths("X_ROOTS", ["/d"]) == ["/d"]
    for bad in ("models", '["/models", 3]', "[/models", "/models/../etc", "[]", '{"a": "/m"}'):
        monkeypatch.setenv("X_ROOTS", bad)
        with pytest.raises(ImproperEnv, match="X_ROOTS"):
            envpaths("X_ROOTS", [])


@pytest.mark.django_db
def test_the_gate_refuses_a_model_outside_the_roots_in_the_request(roots) -> None:  # type: ignore[no-untyped-def]
    from apps.workloads.models import Trace
    from tests.experiments.factories import UserFactory
    from tests.gate.test_gate_api import api_for, gate_file, post_gate
    from tests.runs.factories import make_host

    (roots["outside"] / "secrets" / "tokenizer.json").write_text("{}")
    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    answers = []
    for model_dir in (roots["outside"] / "secrets", roots["outside"] / "no-such-dir"):
        response = post_gate(api, spec=gate_file(model_dir))
        assert response.status_code == 400, response.content
        [error] = response.json()["errors"]
        assert error["field"].endswith("model.path")
        answers.append(error["message"])
    assert answers[0] == answers[1] and "model roots" in answers[0]
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0
