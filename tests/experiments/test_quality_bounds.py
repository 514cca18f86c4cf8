"""A class's validators are bounded at spec time (docs/SPEC.md, "The quality contract"): a JSON
schema whose local ``$ref``s fan out or loop, that reaches outside itself, or that is over a
stated size is refused with a field error naming the exact path, through ``validate_spec``,
which the page, the API and ``experiment_import`` all call; nothing is saved."""

from __future__ import annotations

import datetime
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.experiments import quality_contract as quality
from apps.experiments.spec import SpecError, validate_spec
from tests.experiments.factories import UserFactory, small_spec

FIELD = "classes[1].quality.validators.json_schema"


def chained_schema(depth: int) -> dict[str, Any]:
    """``l0`` is ``allOf: [l1, l1]``, ``l1`` is ``allOf: [l2, l2]``, ...: 2**depth leaves for
    one value, in a schema of a few hundred bytes (depth 12 took 1.2 s an answer, unbounded)."""
    defs: dict[str, Any] = {
        f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
        for i in range(depth)
    }
    defs[f"l{depth}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def errors_for(schema: Any) -> list[tuple[str, str]]:
    spec = small_spec()
    spec["classes"][1]["quality"] = {"validators": {"json_schema": schema}}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    return [(e.path, e.message) for e in info.value.errors]


def test_a_chained_ref_schema_that_doubles_per_level_is_refused_with_its_field() -> None:
    errors = errors_for(chained_schema(12))
    assert [path for path, _ in errors] == [FIELD], errors
    (message,) = (m for _, m in errors)
    assert f"{quality.MAX_SCHEMA_EXPANDED:,}" in message and "#/$defs/l" in message, message


def test_a_ref_cycle_is_refused() -> None:
    for schema in (
        {"$defs": {"a": {"properties": {"next": {"$ref": "#/$defs/a"}}}}, "$ref": "#/$defs/a"},
        {"type": "array", "items": {"$ref": "#"}},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"},
    ):
        errors = errors_for(schema)
        assert [path for path, _ in errors] == [FIELD], errors
        assert "cycle" in errors[0][1], errors


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "https://example.com/schema.json"}, "only local references"),
        ({"$ref": "file:///etc/hostname"}, "only local references"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"$id": "https://example.com/s", "type": "object"}, "$id"),
        ({"$defs": {"a": {"$anchor": "a"}}, "$ref": "#a"}, "anchor"),
        ({"$defs": {"a": {"$anchor": "a"}}}, "$anchor"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef"),
        ({"$schema": "http://json-schema.org/draft-04/schema#"}, "$schema"),
        ({"type": "string", "pattern": "(a+)+$"}, "pattern"),
        ({"properties": {"a": {"patternProperties": {"x": {}}}}}, "patternProperties"),
        ({"enum": ["x" * (quality.MAX_SCHEMA_BYTES + 1)]}, "bytes"),
        ({"enum": list(range(quality.MAX_SCHEMA_NODES + 1))}, "values"),
        ({"properties": {f"p{i}": {"type": "integer"} for i in range(quality.MAX_SCHEMA_EXPANDED)}}, "expand"),
    ],
    ids=["remote", "file", "dangling", "id", "anchor ref", "anchor", "dynamic", "old dialect", "pattern",
         "nested patternProperties", "bytes", "nodes", "expanded"],
)  # fmt: skip
def test_what_cannot_be_bounded_is_refused_with_its_field(schema: Any, words: str) -> None:
    errors = errors_for(schema)
    assert [path for path, _ in errors] == [FIELD], errors
    assert words in errors[0][1], errors


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": [float("nan")]},
        {"const": float("inf")},
        {1: {"type": "object"}},
        {"default": datetime.date(2026, 1, 1)},
        {"$ref": 5},
        {"$ref": "#/$defs/a/0"},
        {"$defs": [], "$ref": "#/$defs/0"},
        {"$defs": {"a": 5}, "$ref": "#/$defs/a"},
        {"allOf": "x"},
        {"items": [{"type": "string"}]},
        {"$ref": "#/properties/a~2b"},
        {"$ref": "#a%ZZ"},
        [],
        "object",
    ],
    ids=repr,
)
def test_a_hostile_schema_is_a_field_error_never_a_crash(schema: Any) -> None:
    errors = errors_for(schema)
    assert [path for path, _ in errors] == [FIELD], errors


def test_schemas_nested_deeper_than_the_limit_are_refused() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(quality.MAX_SCHEMA_DEPTH):
        schema = {"type": "object", "properties": {"a": schema}}
    errors = errors_for(schema)
    assert [path for path, _ in errors] == [FIELD] and "deep" in errors[0][1], errors


def test_bounded_schemas_with_shared_definitions_pass() -> None:
    """Referencing one definition from several places is fine while the whole stays bounded; a
    property may be named like a keyword."""
    address = {"type": "object", "properties": {"street": {"type": "string"}}, "required": ["street"]}
    spec = small_spec()
    spec["classes"][1]["quality"] = {
        "validators": {
            "json_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$defs": {"address": address},
                "type": "object",
                "properties": {
                    "billing": {"$ref": "#/$defs/address"},
                    "shipping": {"$ref": "#/$defs/address"},
                    "pattern": {"type": "string"},
                    "$id": {"type": "integer"},
                },
            },
            "regex": r"\{",
        }
    }
    assert validate_spec(spec)["classes"][1]["quality"]["validators"]["regex"] == r"\{"
    spec["classes"][1]["quality"] = {"validators": {"json_schema": chained_schema(6)}}
    validate_spec(spec)  # 2**6 leaves: well inside the bound


def test_a_regex_longer_than_the_limit_is_refused() -> None:
    spec = small_spec()
    spec["classes"][1]["quality"] = {"validators": {"regex": "a" * (quality.MAX_REGEX_CHARS + 1)}}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert [e.path for e in info.value.errors] == ["classes[1].quality.validators.regex"]


@pytest.mark.django_db
def test_experiment_import_refuses_the_chained_schema_and_saves_nothing(tmp_path: Path) -> None:
    from apps.experiments.models import Experiment

    UserFactory(username="erin", roles=["experimenter"])
    spec = json.loads(json.dumps(small_spec()))
    spec["classes"][1]["quality"] = {"validators": {"json_schema": chained_schema(12)}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(CommandError) as info:
        call_command("experiment_import", str(path), "--owner", "erin", stdout=io.StringIO())
    assert f"{FIELD}:" in str(info.value) and "nothing saved" in str(info.value)
    assert Experiment.objects.count() == 0


def test_checking_a_schema_fetches_and_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    reached: list[Any] = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: reached.append(a))
    monkeypatch.setattr("builtins.open", lambda *a, **k: reached.append(a))
    for ref in ("https://example.com/s.json", "file:///etc/hostname", "s.json"):
        errors = errors_for({"allOf": [{"$ref": ref}]})
        assert [path for path, _ in errors] == [FIELD] and "only local references" in errors[0][1]
    assert reached == []


@pytest.mark.django_db
def test_the_page_and_the_api_refuse_the_chained_schema_and_save_nothing(
    client: Any, tmp_path: Path, settings: Any
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile
    from rest_framework.test import APIClient

    from apps.accounts.tokens import token_create
    from apps.experiments.models import Experiment
    from apps.experiments.spec import dump_spec

    settings.DATA_DIR = tmp_path / "data"
    author = UserFactory(username="erin", roles=["experimenter"])
    spec = json.loads(json.dumps(small_spec()))
    spec["classes"][1]["quality"] = {"validators": {"json_schema": chained_schema(12)}}

    _, plaintext = token_create(user=author, name="test")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    response = api.post("/api/v1/experiments", spec, format="json")
    assert response.status_code == 400
    assert [e["field"] for e in response.json()["errors"]] == [FIELD], response.json()

    client.force_login(author)
    upload = SimpleUploadedFile("spec.yaml", dump_spec(spec).encode(), "text/yaml")
    page = client.post("/experiments/new/", {"spec_file": upload, "create": "1"})
    assert page.status_code == 400 and FIELD in page.content.decode()
    assert Experiment.objects.count() == 0
