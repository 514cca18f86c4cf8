"""POST /api/v1/baselines/capture: B0 captured from a named server, pasted text or an approved
manifest; a server only by name, every bad input a 400 naming its field, nothing saved."""

from __future__ import annotations

import copy
import uuid

import pytest
import yaml

from apps.experiments.models import Experiment
from apps.experiments.spec import validate_spec
from tests.api.test_api import client_for
from tests.approvals.test_capture_sources import _approve
from tests.capture_support import vllm_like_server
from tests.experiments.factories import SMALL_SPEC

pytestmark = pytest.mark.django_db
URL = "/api/v1/baselines/capture"


def _fields(response) -> dict[str, str]:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.content
    return {e["field"]: e["message"] for e in response.json()["errors"]}


def test_it_lists_the_sources_and_the_operators_server_names(settings, viewer) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_CAPTURE_SOURCES = {"prod-b": "http://10.0.0.2:8000", "prod-a": "http://10.0.0.1:8000"}
    body = client_for(viewer).get(URL).json()
    assert body == {
        "sources": ["server", "command", "kubernetes", "helm", "manifest"],
        "servers": ["prod-a", "prod-b"],
    }
    assert "10.0.0" not in str(body)  # names only, never the addresses behind them


def test_it_captures_from_a_named_server_and_never_from_an_address(settings, author) -> None:  # type: ignore[no-untyped-def]
    with vllm_like_server() as (url, asked):
        _named_server_only(settings, author, url, asked)


def _named_server_only(settings, author, url: str, asked: list[str]) -> None:  # type: ignore[no-untyped-def]
    settings.TAILTUNE_CAPTURE_SOURCES = {"prod": url}
    api = client_for(author)
    answer = api.post(URL, {"source": "server", "server": "prod"}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["fragment"]["controls"]["max_model_len"] == 4096
    assert body["fragment"]["baseline"]["capture"]["name"] == "prod"
    assert yaml.safe_load(body["yaml"]) == body["fragment"]
    assert body["notes"] and "max_num_seqs" in body["notes"][0]
    asked.clear()
    assert _fields(api.post(URL, {"source": "server", "url": url}, format="json")) == {
        "url": "a server is picked by name (server), never by address: ask the operator to name it in "
        "TAILTUNE_CAPTURE_SOURCES"
    }
    assert (
        "is not a server the operator named"
        in _fields(api.post(URL, {"source": "server", "server": url}, format="json"))["server"]
    )
    assert asked == []  # neither address was fetched


def test_it_answers_the_whole_spec_with_b0_replaced_from_an_approved_manifest(
    analysed_experiment, approver, author
) -> None:  # type: ignore[no-untyped-def]
    row = _approve(analysed_experiment, approver)
    before = Experiment.objects.count()
    spec = copy.deepcopy(SMALL_SPEC)
    spec["baseline"] = {"id": "prod", "captured_from": "typed", "args": {"max_num_seqs": 99}}
    answer = client_for(author).post(
        URL, {"source": "manifest", "experiment": analysed_experiment.pk, "spec": spec}, format="json"
    )
    assert answer.status_code == 200, answer.content
    out = answer.json()["spec"]
    assert out["baseline"]["id"] == "prod"
    assert out["baseline"]["args"] == analysed_experiment.cells.get(role="baseline").args
    assert out["baseline"]["capture"]["sha256"] == row.json_sha256
    assert validate_spec(out)["baseline"]["capture"]["source"] == "manifest"
    assert Experiment.objects.count() == before  # nothing saved


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"source": "ftp"}, "source", "must be one of server, command, kubernetes, helm, manifest"),
        ({"source": "command", "text": ""}, "text", "is empty"),
        ({"source": "command", "text": "python train.py"}, "text", "no vLLM start found"),
        ({"source": "kubernetes", "text": "kind: Deployment\nspec: [x\n"}, "text", "not valid YAML"),
        ({"source": "kubernetes", "text": "kind: Pod\nspec: {containers: []}\n"}, "text", "no container"),
        ({"source": "helm", "text": "a: [1, 2]\n"}, "text", "no container in the values starts vLLM"),
        ({"source": "manifest", "experiment": 10**25}, "experiment", "must be an experiment's id"),
        ({"source": "manifest", "experiment": True}, "experiment", "must be an experiment's id"),
        ({"source": "command", "text": 5}, "text", "must be text"),
        ({"source": "command", "text": "vllm serve /m\x00"}, "text", "must be text"),
        ({"source": "server", "shell": "rm"}, "shell", "unknown field"),
        ({"source": "manifest", "spec": "name: [x\n"}, "spec", "not valid YAML"),
    ],
)
def test_a_bad_request_is_a_400_naming_its_field(author, body, field, message) -> None:  # type: ignore[no-untyped-def]
    errors = _fields(client_for(author).post(URL, body, format="json"))
    assert field in errors and message in errors[field], errors


def test_only_an_experimenter_with_a_run_token_captures(viewer, approver) -> None:  # type: ignore[no-untyped-def]
    assert client_for(viewer).post(URL, {"source": "manifest"}, format="json").status_code == 403
    assert client_for(approver).post(URL, {"source": "manifest"}, format="json").status_code == 403


def test_a_pasted_command_is_parsed_once_and_no_more_parses_run_at_once_than_the_operator_allows(
    settings, author, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """vLLM's parser holds a request 15-35 s: a second capture while one runs is told to try again
    (429, Retry-After), and a command line already read is answered without running it again."""
    from django.core.cache import cache

    from workers.engine import vllm_args

    cache.delete("capture-parse-slot:0")
    settings.TAILTUNE_CAPTURE_PARSES = 1
    calls: list[list[str]] = []
    api = client_for(author)
    model = f"/models/m-{uuid.uuid4().hex}"  # a command line no earlier run left in the cache
    command = {"source": "command", "text": f"vllm serve {model} --max-num-seqs 48"}

    def parse(argv, engine_python, *, timeout_s):  # type: ignore[no-untyped-def]
        calls.append(list(argv))
        if len(calls) == 1:  # while this one runs, another capture arrives
            busy = api.post(
                URL, {"source": "command", "text": f"vllm serve {model} --max-num-seqs 8"}, format="json"
            )
            assert busy.status_code == 429 and busy["Retry-After"] == "30", busy.content
            assert "TAILTUNE_CAPTURE_PARSES" in busy.json()["errors"][0]["message"]
            assert busy.json()["errors"][0]["field"] == "text"
        return {"model": model, "args": {"max_num_seqs": 48}, "vllm_version": vllm_args.PINNED_VERSION}

    monkeypatch.setattr(vllm_args, "parse_serve_command", parse)
    first = api.post(URL, command, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["fragment"]["baseline"]["args"]["max_num_seqs"] == 48
    again = api.post(URL, command, format="json")
    assert again.status_code == 200, again.content
    assert again.json()["fragment"]["baseline"]["args"] == first.json()["fragment"]["baseline"]["args"]
    assert len(calls) == 1  # the busy one never reached the parser; the repeat came from the cache
    after = api.post(
        URL, {"source": "command", "text": f"vllm serve {model} --max-num-seqs 8"}, format="json"
    )
    assert after.status_code == 200, after.content  # the slot was given back
    assert len(calls) == 2
