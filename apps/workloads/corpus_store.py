"""Writes and verified reads of prompt corpora, and the import of request logs.

A corpus is stored like a trace: once, gzip-compressed, keyed by the sha256 of its
canonical bytes (apps/workloads/corpus.py), and every read re-hashes what it returns. A
request log (apps/workloads/requestlog.py) becomes a trace and the corpus of its prompts,
both stored in one transaction. Both arrive by content (a file's bytes, from the
``corpus_import`` or ``trace_import`` command), never as a path a spec names, and every text
in them was redacted while it was parsed, before anything here writes.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from django.db import transaction

from apps.workloads.chat_template import ChatRenderer
from apps.workloads.corpus import Corpus as CorpusFile
from apps.workloads.corpus import corpus_dumps, corpus_from_file, corpus_loads, corpus_sha256
from apps.workloads.corpus_prompts import corpus_prompts
from apps.workloads.importers import DEFAULT_MAX_BYTES, check_size
from apps.workloads.models import Corpus, Trace
from apps.workloads.redaction import Redactor
from apps.workloads.requestlog import parse_request_log, trace_from_request_log
from apps.workloads.services import tokenizer_dir, trace_store
from apps.workloads.tracefile import trace_sha256


class CorpusIntegrityError(RuntimeError):
    """Stored bytes that do not hash to the name they are stored under."""


class CorpusNotFound(LookupError):
    pass


def _content(row: Corpus) -> bytes:
    data = gzip.decompress(bytes(row.content_gz))
    actual = corpus_sha256(data)
    if actual != row.sha256:
        raise CorpusIntegrityError(f"corpus {row.sha256} holds bytes hashing to {actual}: refusing to use it")
    return data


def corpus_store(*, corpus: CorpusFile, label: str = "") -> Corpus:
    """Store a corpus once by hash and return its row (the existing one if already stored).

    The bytes are checked to parse back to themselves before anything is written.
    """
    data = corpus_dumps(corpus)
    if corpus_dumps(corpus_loads(data)) != data:
        raise CorpusIntegrityError("corpus does not re-serialise to its own bytes")
    sha = corpus_sha256(data)
    with transaction.atomic():
        row, created = Corpus.objects.get_or_create(
            sha256=sha,
            defaults={
                "source": str(corpus.meta.get("source", "file"))[:32],
                "label": label[:200],
                "entries": len(corpus.entries),
                "meta": corpus.meta,
                "content_gz": gzip.compress(data, compresslevel=6, mtime=0),
            },
        )
        if not created:
            _content(row)
    return row


def corpus_import(
    *, data: bytes, redact: Redactor, label: str = "", max_bytes: int = DEFAULT_MAX_BYTES
) -> Corpus:
    """A team's corpus file (by content), redacted and stored; a bad line raises CorpusError and saves nothing."""
    check_size(len(data), max_bytes=max_bytes, name="corpus file")
    return corpus_store(corpus=corpus_from_file(data, redact=redact), label=label)


def corpus_content(*, sha256: str) -> bytes:
    """The canonical bytes named by ``sha256``, verified."""
    row = Corpus.objects.filter(sha256=sha256).first()
    if row is None:
        raise CorpusNotFound(f"no stored corpus with sha256 {sha256}")
    return _content(row)


def corpus_load(*, sha256: str) -> CorpusFile:
    return corpus_loads(corpus_content(sha256=sha256))


def request_log_import(
    *,
    data: bytes,
    model_dir: str | Path,
    tokenizer_revision: str,
    thresholds: Sequence[tuple[str, int | None]],
    max_model_len: int,
    redact: Redactor,
    priorities: Mapping[str, int] | None = None,
    busiest_s: float | None = None,
    window_start_s: float | None = None,
    window_length_s: float | None = None,
    speed: float = 1.0,
    warmup_s: float = 0.0,
    default_output_tokens: int | None = None,
    label: str = "",
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[Trace, Corpus]:
    """Import a request log (OpenAI request format) as a stored trace and the corpus of its prompts.

    Steps: 1. size cap; 2. parse and redact every line (a bad line raises CorpusError naming
    it); 3. window, speed, the chat template's counts, classes by rule (the model directory's
    tokenizer: the one the server loads); 4. store the corpus and the trace, in one
    transaction. Nothing is stored unless every step passed.
    """
    check_size(len(data), max_bytes=max_bytes, name="request log")
    log = parse_request_log(data, redact=redact, default_output_tokens=default_output_tokens)
    trace, corpus = trace_from_request_log(
        log,
        renderer=ChatRenderer(model_dir),
        thresholds=thresholds,
        tokenizer_revision=tokenizer_revision,
        max_model_len=max_model_len,
        priorities=priorities,
        busiest_s=busiest_s,
        window_start_s=window_start_s,
        window_length_s=window_length_s,
        speed=speed,
        warmup_s=warmup_s,
        label=label,
        source_sha256=trace_sha256(data),
    )
    with transaction.atomic():
        corpus_row = corpus_store(corpus=corpus, label=label)
        trace_row = trace_store(trace=trace, label=label)
    return trace_row, corpus_row


def experiment_corpus_prompts(experiment: Any) -> Any:
    """The spec's ``workload.prompts`` corpus, rendered with the experiment's tokenizer and ready
    to be drawn from (apps/workloads/corpus_prompts.py); None for exact-length token ids."""
    prompts = ((experiment.spec or {}).get("workload") or {}).get("prompts") or {}
    sha = prompts.get("corpus_sha256")
    if not sha:
        return None
    model = tokenizer_dir(experiment.model_path)
    outputs = {c.name: c.output_tokens for c in experiment.classes.all()}
    try:
        stamp = (model / "tokenizer.json").stat().st_mtime_ns
    except OSError:
        stamp = 0
    # The probe's steps and the freeze draw from the same rendering: rendered once per worker.
    key = (sha, str(model), stamp, int(experiment.max_model_len), tuple(sorted(outputs.items())))
    if key not in _CORPUS_PROMPTS:
        _CORPUS_PROMPTS.clear()
        _CORPUS_PROMPTS[key] = corpus_prompts(
            corpus_load(sha256=sha),
            sha256=sha,
            renderer=ChatRenderer(model),
            max_model_len=int(experiment.max_model_len),
            output_tokens=outputs,
        )
    return _CORPUS_PROMPTS[key]


_CORPUS_PROMPTS: dict[tuple[Any, ...], Any] = {}
