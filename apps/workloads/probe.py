"""The quality probe's frozen prompt set (apps/experiments/quality_contract.py): a canonical trace.

``prompts_per_class`` prompts of each class, at the class's input length, drawn from the
experiment seed with the same corpus and tokenizer as the sweep's traces, each capped at the
probe's ``max_tokens``; stored once by hash like every trace (apps/workloads/services.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apps.workloads.prompts import PromptTokenizer, build_prompts, corpus_sha256, stable_seed
from apps.workloads.tracefile import Trace, TraceRequest

GENERATOR = "tailtune quality probe v1"


def probe_trace(
    *,
    classes: Sequence[Mapping[str, Any]],
    prompts_per_class: int,
    max_tokens: int,
    seed: int,
    tokenizer: PromptTokenizer,
    tokenizer_revision: str,
) -> Trace:
    """The probe: for each class in order, ``prompts_per_class`` prompts (indices in that order)."""
    rows = [c for c in classes for _ in range(prompts_per_class)]
    prompts = build_prompts(
        tokenizer=tokenizer,
        requests=[(c["name"], int(c["input_tokens"]), 0) for c in rows],
        seed=stable_seed(seed, "quality-probe"),
    )
    requests = [
        TraceRequest(
            index=i,
            t_offset_s=0.0,
            klass=str(c["name"]),
            input_tokens=int(c["input_tokens"]),
            output_tokens=int(max_tokens),
            prompt_token_ids=prompts[i],
        )
        for i, c in enumerate(rows)
    ]
    meta = {
        "generator": GENERATOR,
        "kind": "quality-probe",
        "tokenizer_revision": tokenizer_revision,
        "tokenizer_sha256": tokenizer.sha256,
        "seed": int(seed),
        "prompts_per_class": int(prompts_per_class),
        "max_tokens": int(max_tokens),
        "classes": [dict(c) for c in classes],
        "corpus_sha256": corpus_sha256(prompts),
        "requests": len(requests),
        "warmup_s": 0.0,
        "observation_s": 0.0,
        "prompt_encoding": "token_ids_without_special_tokens",
    }
    return Trace(meta=meta, requests=requests)
