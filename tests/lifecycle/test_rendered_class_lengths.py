"""An experiment replaying a request log's trace: its classes' lengths are the rendered counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.experiments.models import Experiment
from apps.lifecycle.creation import experiment_create
from apps.lifecycle.running import experiment_freeze_and_enqueue
from apps.workloads.corpus_store import request_log_import
from apps.workloads.redaction import redactor
from tests.experiments.factories import UserFactory, small_spec
from tests.runs.factories import make_host
from tests.workloads.test_requestlog import EXAMPLE
from workers.engine.tinymodel import build_tokenizer

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("chat-model"))


def test_an_experiment_replaying_a_chat_log_takes_the_rendered_class_lengths(tokenizer_dir: Path) -> None:
    trace, corpus = request_log_import(
        data=EXAMPLE.read_bytes(),
        model_dir=tokenizer_dir,
        tokenizer_revision="r",
        thresholds=[("short", 100), ("long", None)],
        max_model_len=2048,
        redact=redactor(rules=["email"]),
    )
    rendered = {name: v["median"] for name, v in trace.meta["class_input_tokens"].items()}
    assert set(rendered) == {"short", "long"} and rendered["short"] < rendered["long"]
    spec = small_spec()
    spec["model"] = {**spec["model"], "path": str(tokenizer_dir)}
    spec["workload"] = {**spec["workload"], "arrival": {"process": "trace", "trace_sha256": trace.sha256}}
    assert [c["input_tokens"] for c in spec["classes"]] == [64, 1024]  # typed, and not what is replayed
    make_host()
    experiment = experiment_create(spec=spec, owner=UserFactory())
    assert {c.name: c.input_tokens for c in experiment.classes.all()} == rendered
    assert {c["name"]: c["input_tokens"] for c in experiment.spec["classes"]} == rendered
    Experiment.objects.filter(pk=experiment.pk).update(status="running")
    experiment_freeze_and_enqueue(experiment_id=experiment.pk)
    # Every run names the log's corpus: the stored corpus's own hash.
    assert set(experiment.runs.values_list("corpus_sha256", flat=True)) == {corpus.sha256}
