"""Generated traffic with a team's prompts: ``workload.prompts`` names a stored corpus, the classes
take its rendered lengths, and every frozen request carries one of its class's entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apps.experiments.models import Experiment
from apps.experiments.spec import SpecError, validate_spec
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.workloads.chat_template import ChatRenderer
from apps.workloads.corpus import Corpus, CorpusEntry
from apps.workloads.corpus_prompts import CorpusPromptError, corpus_prompts
from apps.workloads.corpus_store import corpus_import
from apps.workloads.redaction import redactor
from apps.workloads.services import trace_load
from tests.experiments.factories import UserFactory, small_spec
from tests.runs.factories import make_host
from workers.engine.tinymodel import build_tokenizer

SHORT = ["What time does the library open?", "Is the pool open on Sundays?", "Where is the town hall?"]
LONG = [" ".join(["Please summarise the minutes of the council meeting about the new bus routes."] * 12)]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("chat-model"))


def _corpus_file() -> bytes:
    lines = [{"class": "short", "messages": [{"role": "user", "content": t}]} for t in SHORT]
    lines += [{"class": "long", "prompt": t} for t in LONG]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _spec(tokenizer_dir: Path, sha: str, **workload: Any) -> dict[str, Any]:
    spec = small_spec()
    spec["model"] = {**spec["model"], "path": str(tokenizer_dir)}
    spec["workload"] = {**spec["workload"], "prompts": {"corpus_sha256": sha}, **workload}
    return spec


def test_the_spec_checks_the_prompts_section() -> None:
    spec = small_spec()
    spec["workload"]["prompts"] = {"corpus_sha256": "nope", "path": "/etc/passwd"}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert {e.path for e in info.value.errors} >= {"workload.prompts.corpus_sha256", "workload.prompts.path"}
    spec["workload"]["prompts"] = {"corpus_sha256": "a" * 64}
    spec["workload"]["arrival"] = {"process": "trace", "trace_sha256": "b" * 64}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert "workload.prompts" in {e.path for e in info.value.errors}


def test_draws_are_seeded_per_class_and_a_class_without_prompts_is_named(tokenizer_dir: Path) -> None:
    corpus = Corpus(meta={}, entries=[CorpusEntry(klass="a", prompt=t) for t in SHORT])
    rendered = corpus_prompts(
        corpus,
        sha256="c" * 64,
        renderer=ChatRenderer(tokenizer_dir),
        max_model_len=64,
        output_tokens={"a": 8},
    )
    first = rendered.draw(["a"] * 20, np.random.default_rng(1))
    assert first == rendered.draw(["a"] * 20, np.random.default_rng(1))
    assert {p.entry.prompt for p in first} == set(SHORT)  # every entry can be drawn
    with pytest.raises(CorpusPromptError, match="class\\(es\\) b"):
        rendered.draw(["a", "b"], np.random.default_rng(1))


@pytest.mark.django_db
def test_an_experiment_draws_its_prompts_from_the_corpus_with_their_rendered_lengths(
    tokenizer_dir: Path,
) -> None:
    corpus = corpus_import(data=_corpus_file(), redact=redactor())
    renderer = ChatRenderer(tokenizer_dir)
    short_counts = sorted(renderer.count_chat([{"role": "user", "content": t}]) for t in SHORT)
    long_count = renderer.count_text(LONG[0])
    make_host()
    experiment = experiment_create(spec=_spec(tokenizer_dir, corpus.sha256), owner=UserFactory())
    # The classes' lengths are the corpus's rendered medians, not the typed 64 and 1024.
    assert {c.name: c.input_tokens for c in experiment.classes.all()} == {
        "short": short_counts[1],
        "long": long_count,
    }
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    run = experiment.runs.filter(kind="sweep").exclude(trace_sha256="").first()
    assert run is not None and run.corpus_sha256 == corpus.sha256
    trace = trace_load(sha256=run.trace_sha256)
    assert trace.meta["prompt_source"] == "corpus" and trace.meta["corpus_sha256"] == corpus.sha256
    for request in trace.requests:
        if request.klass == "short":
            assert request.messages is not None and request.messages[0]["content"] in SHORT
            assert request.input_tokens == renderer.count_chat(request.messages)
        else:
            assert request.prompt == LONG[0] and request.input_tokens == long_count
        assert request.prompt_token_ids is None


@pytest.mark.django_db
def test_a_missing_corpus_or_a_class_it_cannot_serve_is_a_field_error(tokenizer_dir: Path) -> None:
    with pytest.raises(SpecError) as info:
        experiment_create(spec=_spec(tokenizer_dir, "d" * 64), owner=UserFactory())
    assert [e.path for e in info.value.errors] == ["workload.prompts.corpus_sha256"]
    only_short = corpus_import(
        data=b'{"class": "short", "prompt": "hello"}\n{"class": "long", "prompt": "'
        + b"word " * 3000
        + b'"}\n',
        redact=redactor(),
    )
    with pytest.raises(SpecError) as info:
        experiment_create(spec=_spec(tokenizer_dir, only_short.sha256), owner=UserFactory())
    (error,) = info.value.errors
    assert error.path == "workload.prompts.corpus_sha256" and "long (1 entries too long" in error.message
    assert not Experiment.objects.exists()
