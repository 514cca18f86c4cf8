"""Writes and verified reads of frozen traces.

A trace is stored once, gzip-compressed, keyed by the sha256 of its
canonical bytes. Every read re-hashes the bytes it returns, so a run that
names a hash can only ever replay exactly that traffic.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction

from apps.workloads.generate import generate_trace, trace_from_imported
from apps.workloads.importers import (
    DEFAULT_MAX_BYTES,
    busiest_window,
    cap_to_context,
    parse_trace_bytes,
    scale_time,
    select_window,
)
from apps.workloads.models import Trace
from apps.workloads.prompts import PromptTokenizer
from apps.workloads.stats import trace_file_stats
from apps.workloads.tracefile import Trace as TraceFile
from apps.workloads.tracefile import trace_dumps, trace_loads, trace_sha256


class TraceIntegrityError(RuntimeError):
    """Stored bytes that do not hash to the name they are stored under."""


class TraceNotFound(LookupError):
    pass


def _compress(data: bytes) -> bytes:
    # mtime=0: the same trace always compresses to the same bytes. Level 1:
    # random token ids barely compress further (45% vs 39% at level 6) and a
    # 15 MB trace takes 0.2 s instead of 2.5 s.
    return gzip.compress(data, compresslevel=1, mtime=0)


def _content(row: Trace) -> bytes:
    data = gzip.decompress(bytes(row.content_gz))
    actual = trace_sha256(data)
    if actual != row.sha256:
        raise TraceIntegrityError(f"trace {row.sha256} holds bytes hashing to {actual}: refusing to use it")
    return data


@dataclass(frozen=True)
class _Frozen:
    """A trace reduced to what its row holds: verified, compressed, small."""

    sha256: str
    blob: bytes
    fields: dict[str, Any]


def _freeze(trace: TraceFile) -> _Frozen:
    """Serialise and check a trace: it must parse back to its own bytes, and the
    compressed blob must inflate to the same hash."""
    data = trace_dumps(trace)
    sha = trace_sha256(data)
    if trace_dumps(trace_loads(data)) != data:
        raise TraceIntegrityError("trace does not re-serialise to its own bytes")
    blob = _compress(data)
    if trace_sha256(gzip.decompress(blob)) != sha:
        raise TraceIntegrityError("compressed trace does not inflate to the same bytes")
    fields = {
        "corpus_sha256": trace.meta.get("corpus_sha256", ""),
        "kind": str(trace.meta.get("kind", "generated"))[:32],
        "requests": len(trace.requests),
        "duration_s": trace.duration_s,
        "meta": trace.meta,
        "stats": trace_file_stats(trace),
    }
    return _Frozen(sha256=sha, blob=blob, fields=fields)


def _save(frozen: _Frozen, label: str) -> Trace:
    existing = Trace.objects.filter(sha256=frozen.sha256).first()
    if existing is not None:
        _content(existing)
        return existing
    row, created = Trace.objects.get_or_create(
        sha256=frozen.sha256,
        defaults={**frozen.fields, "label": label[:200], "content_gz": frozen.blob},
    )
    if not created:
        # Another writer stored it between our check and our insert.
        _content(row)
    return row


def trace_store(*, trace: TraceFile, label: str = "") -> Trace:
    """Store a trace once by hash and return its row (the existing one if already stored).

    The bytes are checked to parse back to themselves and the compressed
    blob to inflate to the same hash before anything is written.
    """
    frozen = _freeze(trace)
    with transaction.atomic():
        return _save(frozen, label)


def trace_store_bytes(*, data: bytes, label: str = "") -> Trace:
    """Store an uploaded canonical trace file; a bad file raises TraceFormatError and saves nothing."""
    return trace_store(trace=trace_loads(data), label=label)


def trace_import(
    *,
    data: bytes,
    fmt: str,
    tokenizer_dir: str | Path,
    tokenizer_revision: str,
    thresholds: list[tuple[str, int | None]],
    max_model_len: int,
    priorities: dict[str, int] | None = None,
    window_start_s: float | None = None,
    window_length_s: float | None = None,
    busiest_s: float | None = None,
    speed: float = 1.0,
    warmup_s: float = 0.0,
    seed: int = 0,
    label: str = "",
    max_bytes: int = DEFAULT_MAX_BYTES,
    sec_multiplier: float = 1.0,
    block_tokens: int = 16,
) -> Trace:
    """Import a real trace file as a stored canonical trace (kind ``imported``).

    Steps: 1. parse strictly (size cap first; any error names the line);
    2. cut a window (start + length, or the busiest ``busiest_s`` seconds);
    3. scale time by ``speed``; 4. cap rows to the model's context; 5. build
    the canonical trace; 6. store it. Errors raise before anything is saved.
    """
    if busiest_s is not None and window_start_s is not None:
        raise ValueError("choose a window by start and length or by busiest_s, not both")
    imported = parse_trace_bytes(
        data, fmt=fmt, max_bytes=max_bytes, sec_multiplier=sec_multiplier, block_tokens=block_tokens
    )
    if busiest_s is not None:
        imported = busiest_window(imported, length_s=busiest_s)
    elif window_start_s is not None or window_length_s is not None:
        if window_start_s is None or window_length_s is None:
            raise ValueError("a window needs both window_start_s and window_length_s")
        imported = select_window(imported, start_s=window_start_s, length_s=window_length_s)
    if speed != 1.0:
        imported = scale_time(imported, speed=speed)
    imported = cap_to_context(imported, max_model_len=max_model_len)
    trace = trace_from_imported(
        imported=imported,
        thresholds=thresholds,
        priorities=priorities,
        tokenizer_dir=tokenizer_dir,
        tokenizer_revision=tokenizer_revision,
        seed=seed,
        warmup_s=warmup_s,
        label=label,
        source_sha256=trace_sha256(data),
    )
    return trace_store(trace=trace, label=label)


def trace_content(*, sha256: str) -> bytes:
    """The canonical bytes named by ``sha256``, verified."""
    row = Trace.objects.filter(sha256=sha256).first()
    if row is None:
        raise TraceNotFound(f"no stored trace with sha256 {sha256}")
    return _content(row)


def trace_load(*, sha256: str) -> TraceFile:
    """The parsed trace named by ``sha256``; its bytes are re-hashed first."""
    return trace_loads(trace_content(sha256=sha256))


def tokenizer_dir(model_path: str) -> Path:
    """The model directory (which holds tokenizer.json); relative paths start at BASE_DIR."""
    path = Path(model_path)
    return path if path.is_absolute() else Path(settings.BASE_DIR) / path


def model_revisions(model_path: str) -> dict[str, str]:
    """The revisions a model directory records, as defaults for a spec's model.revision and
    tokenizer_revision: tailtune's revision file (the tiny local model), or a Hugging Face
    cache layout (``snapshots/<commit>`` itself, or a repo folder whose ``refs/main`` names it).
    Empty when the directory records none."""
    import json

    if not model_path:
        return {}
    path = tokenizer_dir(model_path)
    record = path / "tailtune-revision.json"
    try:
        if record.is_file():
            data = json.loads(record.read_text())
            return {k: str(data[k]) for k in ("model_revision", "tokenizer_revision") if data.get(k)}
        commit = ""
        if path.parent.name == "snapshots":
            commit = path.name
        elif (path / "refs" / "main").is_file():
            commit = (path / "refs" / "main").read_text().strip()
    except (OSError, ValueError):
        return {}
    return {"model_revision": commit, "tokenizer_revision": commit} if commit else {}


class TraceClass(TypedDict):
    """A request class as the trace generator takes it (apps/workloads/generate.py)."""

    name: str
    input_tokens: int
    output_tokens: int
    priority: int
    shared_prefix_tokens: int


def trace_classes(experiment: Any) -> list[TraceClass]:
    """The experiment's request classes, in their order, as the trace generator takes them."""
    return [
        {
            "name": c.name,
            "input_tokens": c.input_tokens,
            "output_tokens": c.output_tokens,
            "priority": c.priority,
            "shared_prefix_tokens": c.shared_prefix_tokens,
        }
        for c in experiment.classes.all()
    ]


def workload_traces_freeze(
    *,
    experiment: Any,
    uniform: bool = False,
    repeats: Sequence[int] | None = None,
    corpus: Any = None,
    points: Sequence[tuple[str, str]] | None = None,
) -> dict[tuple[str, str, int], Trace]:
    """Generate and store every trace of the experiment's plan: one per (mixture, rate, repeat).

    Repeats are 1-based as in the run plan. ``uniform`` gives the constant
    -spacing companions instead; ``repeats`` names which repeats are made (default: the
    workload's; a number past them is a draw no round replays, as a search's screening point
    takes: apps/lifecycle/search_steps.py); ``points`` limits the (mixture, rate) pairs.
    All traces are generated before anything
    is written, then stored in one transaction: a failure stores none. An
    experiment replaying an imported trace maps every key to that trace.
    """
    workload = experiment.workload
    keys = [
        (mixture, rate_name, repeat)
        for mixture in workload.mixtures
        for rate_name in workload.rates
        for repeat in (repeats if repeats is not None else range(1, workload.repeats + 1))
        if points is None or (mixture, rate_name) in points
    ]
    if workload.arrival_process == "trace":
        row = Trace.objects.filter(sha256=workload.imported_trace_sha256).first()
        if row is None:
            raise TraceNotFound(
                f"workload names imported trace {workload.imported_trace_sha256!r}, not stored"
            )
        _content(row)
        return dict.fromkeys(keys, row)
    classes = trace_classes(experiment)
    tok_dir = tokenizer_dir(experiment.model_path)
    tok = PromptTokenizer(tok_dir)
    # Each trace is reduced to its compressed bytes as soon as it is built:
    # a seed sweep's 18 traces hold ~20M token ids, too many to keep as
    # Python lists, and generation stays outside the (short) transaction.
    # With repeat_traces "same", every repeat of the plan replays the first repeat's trace: one is
    # generated per (mixture, rate) and mapped to all of its repeats. A repeat past the plan's is
    # its own draw either way (a search screens on data no confirmation round replays).
    frozen: dict[tuple[str, str, int], _Frozen] = {}
    for mixture, rate_name, repeat in keys:
        same = workload.repeat_traces == "same" and repeat <= workload.repeats
        if same and (mixture, rate_name, 1) in frozen:
            frozen[(mixture, rate_name, repeat)] = frozen[(mixture, rate_name, 1)]
            continue
        trace = generate_trace(
            classes=classes,
            mixture_name=mixture,
            mixture=workload.mixtures[mixture],
            rate_name=rate_name,
            rate_rps=workload.rate_for(mixture, rate_name),
            arrival_process=workload.arrival_process,
            arrival_cv=workload.arrival_cv,
            seed=workload.seed,
            repeat=1 if same else repeat,
            warmup_s=workload.warmup_s,
            observation_s=workload.observation_s,
            tokenizer_dir=tok_dir,
            tokenizer_revision=experiment.tokenizer_revision,
            uniform=uniform,
            tokenizer=tok,
            corpus=corpus,
        )
        frozen[(mixture, rate_name, repeat)] = _freeze(trace)
        del trace
    with transaction.atomic():
        return {
            key: _save(item, f"{experiment.name} {key[0]} {key[1]} r{key[2]}{' uniform' if uniform else ''}")
            for key, item in frozen.items()
        }


def quality_probe_freeze(*, experiment: Any) -> Trace | None:
    """Store the experiment's quality probe (apps/workloads/probe.py) once by hash; None without one.

    A spec naming ``quality.probe.trace_sha256`` uses that stored trace, which must exist.
    """
    from apps.workloads.probe import probe_trace

    options = ((experiment.spec or {}).get("quality") or {}).get("probe")
    if not options:
        return None
    if options.get("trace_sha256"):
        row = Trace.objects.filter(sha256=options["trace_sha256"]).first()
        if row is None:
            raise TraceNotFound(
                f"quality.probe.trace_sha256 names trace {options['trace_sha256']!r}, not stored"
            )
        return row
    classes = [{"name": c.name, "input_tokens": c.input_tokens} for c in experiment.classes.all()]
    trace = probe_trace(
        classes=classes,
        prompts_per_class=int(options["prompts_per_class"]),
        max_tokens=int(options["max_tokens"]),
        seed=int(experiment.workload.seed),
        tokenizer=PromptTokenizer(tokenizer_dir(experiment.model_path)),
        tokenizer_revision=experiment.tokenizer_revision,
    )
    return trace_store(trace=trace, label=f"{experiment.name} quality probe")
