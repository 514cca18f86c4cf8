"""Corpora stored by hash, and request logs imported as a trace and its corpus."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.workloads.corpus import CorpusError, corpus_dumps, corpus_from_file, corpus_sha256
from apps.workloads.corpus_store import (
    CorpusIntegrityError,
    corpus_content,
    corpus_import,
    corpus_load,
    corpus_store,
    request_log_import,
)
from apps.workloads.models import Corpus, Trace
from apps.workloads.redaction import redactor
from apps.workloads.services import trace_load
from tests.workloads.test_requestlog import EXAMPLE

pytestmark = pytest.mark.django_db

SECRETS = (b"@example.org", b"sk-demo", b"555-01")


def _corpus_file(*entries: dict[str, object]) -> bytes:
    return "".join(json.dumps(e) + "\n" for e in entries).encode()


def _stored_bytes() -> bytes:
    """Everything the workloads tables hold, inflated: what a reader of the database could see."""
    out = b""
    for row in Corpus.objects.all():
        out += gzip.decompress(bytes(row.content_gz)) + json.dumps(row.meta).encode()
    for row in Trace.objects.all():
        out += gzip.decompress(bytes(row.content_gz)) + json.dumps(row.meta).encode()
    return out


def test_it_stores_a_corpus_once_under_the_hash_of_its_bytes() -> None:
    data = _corpus_file(
        {"class": "chat", "messages": [{"role": "user", "content": "hello"}]},
        {"class": "notes", "prompt": "a note"},
    )
    first = corpus_import(data=data, redact=redactor(), label="one")
    again = corpus_import(data=data.replace(b'", "', b'","'), redact=redactor(), label="two")
    assert again.pk == first.pk and Corpus.objects.count() == 1
    content = corpus_content(sha256=first.sha256)
    assert corpus_sha256(content) == first.sha256 and first.entries == 2
    assert first.meta["classes"] == {"chat": 1, "notes": 1}
    assert corpus_load(sha256=first.sha256).entries[1].prompt == "a note"


def test_a_tampered_corpus_is_refused() -> None:
    row = corpus_store(
        corpus=corpus_from_file(_corpus_file({"class": "c", "prompt": "x"}), redact=redactor())
    )
    other = corpus_dumps(corpus_from_file(_corpus_file({"class": "c", "prompt": "y"}), redact=redactor()))
    Corpus.objects.filter(pk=row.pk).update(content_gz=gzip.compress(other))
    with pytest.raises(CorpusIntegrityError):
        corpus_content(sha256=row.sha256)


def test_the_stored_corpus_never_holds_the_redacted_text() -> None:
    data = _corpus_file(
        {"class": "chat", "messages": [{"role": "user", "content": "I am kit@example.org, call 555-0199"}]},
        {
            "class": "chat",
            "messages": [{"role": "user", "name": "kit@example.org", "content": "sk-demo12345678901234"}],
        },
    )
    row = corpus_import(data=data, redact=redactor(rules=["email", "key", "number"]))
    assert not any(s in _stored_bytes() for s in SECRETS)
    entries = corpus_load(sha256=row.sha256).entries
    assert entries[0].messages == [{"role": "user", "content": "I am [EMAIL], call [NUMBER]"}]
    assert entries[1].messages == [{"role": "user", "name": "[EMAIL]", "content": "[KEY]"}]


def test_a_bad_corpus_line_is_named_and_nothing_is_stored() -> None:
    data = _corpus_file({"class": "c", "prompt": "x"}, {"class": "c"}, {"class": "c", "prompt": "y"})
    with pytest.raises(CorpusError, match="line 2: an entry needs messages or prompt"):
        corpus_import(data=data, redact=redactor())
    assert not Corpus.objects.exists()


def test_it_imports_a_request_log_as_a_trace_and_its_corpus(tokenizer_dir: Path) -> None:
    trace, corpus = request_log_import(
        data=EXAMPLE.read_bytes(),
        model_dir=tokenizer_dir,
        tokenizer_revision="tiny-llama-local-v1",
        thresholds=[("short", 100), ("long", None)],
        max_model_len=4096,
        redact=redactor(rules=["email", "key", "number"]),
        warmup_s=1.0,
        label="example",
    )
    # The run's corpus_sha256 is the trace's, which is the stored corpus's own.
    assert trace.corpus_sha256 == corpus.sha256 == corpus_sha256(corpus_content(sha256=corpus.sha256))
    assert trace.kind == "imported" and trace.requests == corpus.entries == 32
    loaded = trace_load(sha256=trace.sha256)
    stored = corpus_load(sha256=corpus.sha256)
    assert [r.messages for r in loaded.requests] == [e.messages for e in stored.entries]
    assert [r.klass for r in loaded.requests] == [e.klass for e in stored.entries]
    assert loaded.meta["redaction"]["rules"] == ["email", "key", "number"]
    assert not any(s in _stored_bytes() for s in SECRETS)
    # The same log again: the same rows, nothing new.
    again, again_corpus = request_log_import(
        data=EXAMPLE.read_bytes(),
        model_dir=tokenizer_dir,
        tokenizer_revision="tiny-llama-local-v1",
        thresholds=[("short", 100), ("long", None)],
        max_model_len=4096,
        redact=redactor(rules=["email", "key", "number"]),
        warmup_s=1.0,
        label="example",
    )
    assert (again.pk, again_corpus.pk) == (trace.pk, corpus.pk)


def test_a_bad_log_line_is_named_and_nothing_is_stored(tokenizer_dir: Path) -> None:
    lines = EXAMPLE.read_bytes().split(b"\n")
    lines[6] = b'{"timestamp": 1767225603.0, "body": {"messages": []}}'
    with pytest.raises(CorpusError, match="line 7: messages must be a non-empty list"):
        request_log_import(
            data=b"\n".join(lines),
            model_dir=tokenizer_dir,
            tokenizer_revision="r",
            thresholds=[("all", None)],
            max_model_len=4096,
            redact=redactor(),
        )
    assert not Corpus.objects.exists() and not Trace.objects.exists()


def _call(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_the_commands_import_a_log_and_a_corpus_file(tokenizer_dir: Path, tmp_path: Path) -> None:
    common = ["--model-dir", str(tokenizer_dir), "--tokenizer-revision", "r", "--max-model-len", "4096"]
    with pytest.raises(CommandError, match="--redact is required"):
        _call("trace_import", str(EXAMPLE), "--format", "openai-log", *common)
    sha = _call(
        "trace_import",
        str(EXAMPLE),
        "--format",
        "openai-log",
        *common,
        "--classes",
        "short:100,long",
        "--redact",
        "email,key",
        "--redact-pattern",
        "Robin|Alex",
    )
    row = Trace.objects.get(sha256=sha)
    assert row.meta["source_format"] == "openai-log" and len(row.meta["redaction"]["pattern_sha256"]) == 1
    assert b"Robin" not in gzip.decompress(bytes(row.content_gz))
    assert Corpus.objects.filter(sha256=row.corpus_sha256).exists()
    corpus_path = tmp_path / "corpus.jsonl"
    corpus_path.write_bytes(_corpus_file({"class": "c", "prompt": "call 555-0100"}))
    corpus_sha = _call("corpus_import", str(corpus_path), "--redact", "number")
    assert corpus_load(sha256=corpus_sha).entries[0].prompt == "call [NUMBER]"
    with pytest.raises(CommandError, match="--redact: unknown redaction rule"):
        _call("corpus_import", str(corpus_path), "--redact", "phone")
