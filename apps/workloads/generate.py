"""Build canonical traces: generated from a workload, or from an imported window.

Pure: no Django. Every random choice comes from a seed derived with sha256
from the experiment seed and the (mixture, rate, repeat) names, so the same
spec gives byte-identical traces, hence the same ``trace_sha256``, on any
machine. Paths never enter a trace: only the tokenizer's revision and the
sha256 of its tokenizer.json do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from apps.workloads import arrivals
from apps.workloads.corpus_prompts import CorpusPromptError, CorpusPrompts, prompt_fields
from apps.workloads.importers import ImportedTrace, assign_classes
from apps.workloads.prompts import PromptTokenizer, build_prompts, corpus_sha256, stable_seed
from apps.workloads.tracefile import T_DECIMALS, Trace, TraceRequest

GENERATOR = "tailtune.workloads.generate/1"
CLASS_KEYS = ("name", "input_tokens", "output_tokens", "priority", "shared_prefix_tokens")


class GenerateError(ValueError):
    """Parameters that cannot produce a trace; the message names the field."""


def trace_seed(*, experiment_seed: int, mixture: str, rate_name: str, repeat: int) -> int:
    """The seed of one (mixture, rate, repeat): sha256-derived, machine independent."""
    return stable_seed("trace", int(experiment_seed), mixture, rate_name, int(repeat))


def draw_classes(*, weights: Mapping[str, float], count: int, rng: np.random.Generator) -> list[str]:
    """Class labels for ``count`` requests, shares as close to ``weights`` as whole counts allow.

    Steps: 1. floor of weight x count per class; 2. the remaining requests go
    to the largest remainders (declaration order on ties); 3. a seeded
    shuffle spreads the classes over the trace. Exact quotas (rather than
    independent draws) keep a short trace's mixture on target.
    """
    names = [n for n, w in weights.items() if w > 0]
    if not names:
        raise GenerateError("mixture: at least one class needs a positive weight")
    total = sum(weights[n] for n in names)
    exact = [weights[n] / total * count for n in names]
    counts = [math.floor(x) for x in exact]
    remainder = count - sum(counts)
    by_fraction = sorted(range(len(names)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_fraction[:remainder]:
        counts[i] += 1
    labels = np.array([name for name, c in zip(names, counts, strict=True) for _ in range(c)], dtype=object)
    return [str(x) for x in rng.permutation(labels)]


def _class_table(classes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for i, cls in enumerate(classes):
        name = cls.get("name")
        if not isinstance(name, str) or not name:
            raise GenerateError(f"classes[{i}].name is required")
        entry: dict[str, Any] = {"name": name}
        for key in CLASS_KEYS[1:]:
            value = cls.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int):
                raise GenerateError(f"classes[{i}].{key} must be an integer, got {value!r}")
            entry[key] = value
        if entry["input_tokens"] < 1 or entry["output_tokens"] < 1:
            raise GenerateError(f"classes[{i}]: input_tokens and output_tokens must be positive")
        if not 0 <= entry["shared_prefix_tokens"] <= entry["input_tokens"]:
            raise GenerateError(f"classes[{i}].shared_prefix_tokens must be between 0 and input_tokens")
        table[name] = entry
    return table


def _requests(
    times: np.ndarray,
    *,
    labels: Sequence[str],
    inputs: Sequence[int],
    outputs: Sequence[int],
    priorities: Sequence[int],
    prompts: Sequence[list[int]] | None,
    warmup_s: float,
    hash_ids: Sequence[list[int]] | None = None,
    texts: Sequence[Mapping[str, Any]] | None = None,
) -> list[TraceRequest]:
    """The trace's requests: token-id ``prompts``, or ``texts`` (each request's ``prompt`` or
    ``messages``, a corpus's entries)."""
    out = []
    for i, t in enumerate(times):
        # Warm-up is decided on the rounded time, the one that is written.
        offset = round(float(t), T_DECIMALS)
        out.append(
            TraceRequest(
                index=i,
                t_offset_s=offset,
                klass=labels[i],
                input_tokens=int(inputs[i]),
                output_tokens=int(outputs[i]),
                priority=int(priorities[i]),
                warmup=offset < warmup_s,
                prompt_token_ids=prompts[i] if prompts is not None else None,
                hash_ids=list(hash_ids[i]) if hash_ids is not None and hash_ids[i] else None,
                **(texts[i] if texts is not None else {}),
            )
        )
    return out


def generate_trace(
    *,
    classes: Sequence[Mapping[str, Any]],
    mixture_name: str,
    mixture: Mapping[str, float],
    rate_name: str,
    rate_rps: float,
    arrival_process: str,
    arrival_cv: float | None,
    seed: int,
    repeat: int,
    warmup_s: float,
    observation_s: float,
    tokenizer_dir: str | Path,
    tokenizer_revision: str,
    uniform: bool = False,
    tokenizer: PromptTokenizer | None = None,
    corpus: CorpusPrompts | None = None,
) -> Trace:
    """The trace of one (mixture, rate, repeat) of a workload; ``seed`` is the experiment seed.

    With ``corpus`` (the spec's ``workload.prompts``), step 4 draws each request's prompt from
    its class's corpus entries instead (apps/workloads/corpus_prompts.py): its input_tokens is
    then the entry's rendered count.

    Steps: 1. derive the trace seed; 2. arrivals over [0, warmup_s +
    observation_s); 3. classes by count quotas; 4. one exact-length prompt
    per request; 5. the uniform companion, if asked, keeps 3 and 4 and
    spaces the same requests evenly over the same window.
    """
    table = _class_table(classes)
    for name, weight in mixture.items():
        if name not in table:
            raise GenerateError(f"mixture {mixture_name!r} names unknown class {name!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
            raise GenerateError(f"mixture {mixture_name!r}: weight of {name!r} must be a non-negative number")
    if warmup_s < 0 or not observation_s > 0:
        raise GenerateError("warmup_s must be >= 0 and observation_s > 0")
    duration = float(warmup_s) + float(observation_s)
    s = trace_seed(experiment_seed=seed, mixture=mixture_name, rate_name=rate_name, repeat=repeat)
    try:
        times = arrivals.arrival_times(
            process=arrival_process,
            rate_rps=rate_rps,
            duration_s=duration,
            seed=stable_seed(s, "arrivals"),
            cv=arrival_cv,
        )
    except arrivals.ArrivalError as exc:
        raise GenerateError(str(exc)) from None
    if len(times) == 0:
        raise GenerateError(f"rate {rate_name!r} ({rate_rps} req/s) gives no request in {duration} s")
    labels = draw_classes(
        weights=mixture, count=len(times), rng=np.random.default_rng(stable_seed(s, "classes"))
    )
    rows = [table[label] for label in labels]
    tok = tokenizer or PromptTokenizer(tokenizer_dir)
    drawn = None
    if corpus is not None:
        try:
            drawn = corpus.draw(labels, np.random.default_rng(stable_seed(s, "corpus")))
        except CorpusPromptError as exc:
            raise GenerateError(f"workload.prompts: {exc}") from None
        prompts: list[list[int]] = []
    else:
        prompts = build_prompts(
            tokenizer=tok,
            requests=[(r["name"], r["input_tokens"], r["shared_prefix_tokens"]) for r in rows],
            seed=stable_seed(s, "prompts"),
        )
    if uniform:
        times = arrivals.uniform_companion(times, duration_s=duration)
    used = [table[n] for n in table if mixture.get(n, 0) > 0]
    meta = {
        "generator": GENERATOR,
        "kind": "uniform" if uniform else "generated",
        "tokenizer_revision": tokenizer_revision,
        "tokenizer_sha256": tok.sha256,
        "mixture": mixture_name,
        "mixture_weights": {k: float(v) for k, v in mixture.items()},
        "rate_name": rate_name,
        "rate_rps": float(rate_rps),
        "arrival_process": "constant" if uniform else arrival_process,
        "arrival_cv": None if uniform or arrival_cv is None else float(arrival_cv),
        "bursty_arrival": {"process": arrival_process, "cv": arrival_cv} if uniform else None,
        "seed": int(seed),
        "trace_seed": s,
        "repeat": int(repeat),
        "warmup_s": float(warmup_s),
        "observation_s": float(observation_s),
        "classes": used,
        "corpus_sha256": corpus.sha256 if corpus is not None else corpus_sha256(prompts),
        "requests": len(times),
        # Exact output lengths need the engine to ignore EOS: the replay
        # sends max_tokens = min_tokens = output_tokens for synthetic traces.
        "synthetic_output": True,
        "prompt_encoding": "token_ids_without_special_tokens",
    }
    if corpus is not None and drawn is not None:
        meta.update(
            prompt_encoding="chat_template",
            prompt_source="corpus",
            chat_template_sha256=corpus.template_sha256,
        )
    requests = _requests(
        times,
        labels=labels,
        inputs=[d.input_tokens for d in drawn] if drawn is not None else [r["input_tokens"] for r in rows],
        outputs=[r["output_tokens"] for r in rows],
        priorities=[r["priority"] for r in rows],
        prompts=None if drawn is not None else prompts,
        texts=[prompt_fields(d) for d in drawn] if drawn is not None else None,
        warmup_s=float(warmup_s),
    )
    return Trace(meta=meta, requests=requests)


def uniform_variant(trace: Trace) -> Trace:
    """The same requests (classes, prompts, order) evenly spaced over the same window."""
    meta = dict(trace.meta)
    try:
        duration = float(meta["warmup_s"]) + float(meta["observation_s"])
    except (KeyError, TypeError, ValueError):
        raise GenerateError("trace meta needs warmup_s and observation_s for a uniform variant") from None
    times = arrivals.uniform_companion(np.array([r.t_offset_s for r in trace.requests]), duration_s=duration)
    meta.update(
        kind="uniform",
        bursty_arrival={"process": meta.get("arrival_process"), "cv": meta.get("arrival_cv")},
        arrival_process="constant",
        arrival_cv=None,
    )
    requests = []
    for r, t in zip(trace.requests, times, strict=True):
        offset = round(float(t), T_DECIMALS)
        requests.append(
            TraceRequest(**{**r.__dict__, "t_offset_s": offset, "warmup": offset < float(meta["warmup_s"])})
        )
    return Trace(meta=meta, requests=requests)


def _block_prompt(
    tok: PromptTokenizer, hash_ids: Sequence[int], n: int, block_tokens: int, seed: int, index: int
) -> list[int]:
    # Equal hash ids give equal blocks, so the engine sees the same shared
    # prefixes as the source system; past the blocks, request-own tokens.
    ids: list[int] = []
    for h in hash_ids:
        if len(ids) >= n:
            break
        rng = np.random.default_rng(stable_seed(seed, "block", int(h), block_tokens))
        ids.extend(int(x) for x in rng.choice(tok.allowed, size=block_tokens))
    if len(ids) < n:
        rng = np.random.default_rng(stable_seed(seed, "tail", index))
        ids.extend(int(x) for x in rng.choice(tok.allowed, size=n - len(ids)))
    return ids[:n]


def trace_from_imported(
    *,
    imported: ImportedTrace,
    thresholds: Sequence[tuple[str, int | None]],
    priorities: Mapping[str, int] | None = None,
    tokenizer_dir: str | Path,
    tokenizer_revision: str,
    seed: int,
    warmup_s: float = 0.0,
    label: str = "",
    source_sha256: str = "",
    tokenizer: PromptTokenizer | None = None,
) -> Trace:
    """A canonical trace replaying an imported (windowed, scaled, capped) real trace.

    Failed rows (0 output tokens) cannot be replayed as asked and are left
    out, counted in ``meta.failed_dropped``; a 0-token input becomes 1
    (counted in ``meta.empty_inputs_raised``). Rows with ``hash_ids`` get
    block-shared prompts (exact length as token ids); the others get
    distinct prompts settled like generated ones. Classes come from input
    length ``thresholds``.
    """
    keep = np.flatnonzero(~imported.failed & (imported.output_tokens > 0))
    dropped = len(imported) - len(keep)
    rows = imported.take(keep)
    if not len(rows):
        raise GenerateError("the imported window holds no replayable request")
    raised = int(np.count_nonzero(rows.input_tokens < 1))
    inputs = np.maximum(rows.input_tokens, 1)
    labels = assign_classes(inputs, thresholds)
    prio = dict(priorities or {})
    tok = tokenizer or PromptTokenizer(tokenizer_dir)
    s = stable_seed("imported", int(seed), source_sha256)
    if rows.hash_ids is not None:
        block = rows.block_tokens or 16
        prompts = [
            _block_prompt(tok, h, int(n), block, s, i)
            for i, (h, n) in enumerate(zip(rows.hash_ids, inputs, strict=True))
        ]
    else:
        prompts = build_prompts(
            tokenizer=tok, requests=[(c, int(n), 0) for c, n in zip(labels, inputs, strict=True)], seed=s
        )
    meta = {
        "generator": GENERATOR,
        "kind": "imported",
        "label": label,
        "source_format": imported.source_format,
        "source_sha256": source_sha256,
        "window": imported.window,
        "speed": imported.speed,
        "capped_rows": imported.capped_rows,
        "failed_dropped": dropped,
        "empty_inputs_raised": raised,
        "repairs": list(imported.repairs),
        "class_thresholds": [[name, bound] for name, bound in thresholds],
        "tokenizer_revision": tokenizer_revision,
        "tokenizer_sha256": tok.sha256,
        "seed": int(seed),
        "warmup_s": float(warmup_s),
        # Without a window, observation ends just past the last arrival, so
        # that request is inside [warmup_s, warmup_s + observation_s).
        "observation_s": round(float(rows.t_s[-1]) + 10**-T_DECIMALS - float(warmup_s), T_DECIMALS),
        "corpus_sha256": corpus_sha256(prompts),
        "requests": len(rows),
        "synthetic_output": True,
        "prompt_encoding": "token_ids_without_special_tokens",
    }
    if imported.window is not None:
        meta["observation_s"] = imported.window["length_s"] / imported.speed - float(warmup_s)
    if meta["observation_s"] <= 0:
        raise GenerateError(f"warmup_s {warmup_s} leaves no observation window in this trace")
    requests = _requests(
        rows.t_s,
        labels=labels,
        inputs=[int(n) for n in inputs],
        outputs=[int(n) for n in rows.output_tokens],
        priorities=[int(prio.get(c, 0)) for c in labels],
        prompts=prompts,
        warmup_s=float(warmup_s),
        hash_ids=rows.hash_ids,
    )
    return Trace(meta=meta, requests=requests)
