"""Synthetic experiments for the analysis tests: deterministic traces and records, no database."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.analysis.columns import RecordTable
from apps.analysis.report import build_report
from workers.replay.records import RequestRecord

MS = 1_000_000

CLASSES = [
    {
        "name": "short",
        "input_tokens": 512,
        "output_tokens": 16,
        "ttft_p99_ms": 500.0,
        "e2e_p99_ms": 3000.0,
        "max_stall_ms": 250.0,
        "error_rate": 0.01,
    },
    {
        "name": "long",
        "input_tokens": 8000,
        "output_tokens": 16,
        "ttft_p99_ms": 4000.0,
        "e2e_p99_ms": 8000.0,
        "max_stall_ms": 1000.0,
        "error_rate": 0.01,
    },
]


def request(
    run_id: str,
    index: int,
    cls: str,
    planned_ns: int,
    *,
    warmup: bool = False,
    ttft_ms: float = 50.0,
    itl_ms: float = 10.0,
    tokens: int = 16,
    expected: int = 16,
    tokens_per_chunk: int = 1,
    stall_ms: float | None = None,
    late_ms: float = 0.0,
    status: int | None = 200,
    error_kind: str | None = None,
    unfinished: bool = False,
    cancelled: bool = False,
    sent: bool = True,
) -> RequestRecord:
    """One record; gaps are per chunk of ``tokens_per_chunk`` tokens, one of them ``stall_ms`` if given."""
    rec = RequestRecord(
        run_id=run_id,
        index=index,
        request_class=cls,
        warmup=warmup,
        input_tokens=100,
        expected_output_tokens=expected,
        planned_ns=planned_ns,
        sent=sent,
    )
    if not sent:
        rec.unfinished = unfinished
        return rec
    rec.sent_ns = planned_ns + round(late_ms * MS)
    rec.admission_delay_ns = 0
    rec.http_status = status
    rec.error_kind = error_kind
    rec.cancelled = cancelled
    rec.unfinished = unfinished
    if error_kind is not None or (status is not None and status != 200):
        rec.end_ns = rec.sent_ns + MS
        return rec
    if ttft_ms is None:
        return rec
    first = planned_ns + round(ttft_ms * MS)
    rec.first_token_ns = first
    chunks = max(1, -(-tokens // tokens_per_chunk))
    gaps = [itl_ms * tokens_per_chunk] * (chunks - 1)
    if stall_ms is not None and gaps:
        gaps[len(gaps) // 2] = stall_ms
    t = first
    for g in gaps:
        t += round(g * MS)
        rec.chunk_gaps.add(g * 1000.0)
        rec.token_gaps.add(g * 1000.0 / tokens_per_chunk, weight=tokens_per_chunk)
    rec.chunks = chunks
    rec.last_token_ns = t
    rec.max_gap_ns = round(max(gaps) * MS) if gaps else None
    if not unfinished and not cancelled:
        rec.end_ns = t + MS // 10
        rec.output_tokens = tokens
        rec.prompt_tokens = 100
        rec.finish_reason = "length"
    return rec


@dataclass
class Plan:
    cells: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {
                "cell_id": "B0",
                "role": "baseline",
                "args": {"max_num_batched_tokens": 8192, "max_num_seqs": 64},
                "position": 0,
            },
            {
                "cell_id": "C1",
                "role": "candidate",
                "args": {"max_num_batched_tokens": 2048, "max_num_seqs": 16},
                "position": 1,
            },
            {
                "cell_id": "C2",
                "role": "candidate",
                "args": {"max_num_batched_tokens": 2048, "max_num_seqs": 32},
                "position": 2,
            },
        ]
    )
    classes: list[dict[str, Any]] = field(default_factory=lambda: [dict(c) for c in CLASSES])
    mixtures: dict[str, dict[str, float]] = field(
        default_factory=lambda: {"mix": {"short": 0.5, "long": 0.5}}
    )
    rates: dict[str, float] = field(default_factory=lambda: {"r1": 4.0})
    repeats: int = 3
    per_class: int = 60
    warmup_s: float = 1.0
    observation_s: float = 10.0
    drain_deadline_s: float = 5.0


Behaviour = Callable[[str, str, str, int, str, int], Mapping[str, Any]]


def build(
    plan: Plan,
    behaviour: Behaviour,
    *,
    run_overrides: Callable[[dict[str, Any]], None] | None = None,
    samples: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
    options: Mapping[str, Any] | None = None,
    rollback: Mapping[str, Any] | None = None,
    rehearsals: Mapping[str, Mapping[str, Any]] | None = None,
    rehearse: bool = True,
    output_mode: str = "exact",
    stop_reasons: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None,
    quality_probes: Sequence[Mapping[str, Any]] | None = None,
    class_capacities: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Build every run of the plan, call behaviour(cell, mixture, rate, repeat, class, index) per request."""
    inputs = build_inputs(
        plan, behaviour, run_overrides=run_overrides, samples=samples, output_mode=output_mode
    )
    records = inputs.pop("records")
    return build_report(
        **inputs,
        table=RecordTable.from_records(records),
        rollback=rollback,
        rehearsals=rehearsals,
        rehearse=rehearse,
        options=options,
        stop_reasons=stop_reasons,
        quality_probes=quality_probes,
        class_capacities=class_capacities,
    )


def build_inputs(
    plan: Plan,
    behaviour: Behaviour,
    *,
    run_overrides: Callable[[dict[str, Any]], None] | None = None,
    samples: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
    output_mode: str = "exact",
) -> dict[str, Any]:
    """build_report's experiment, cells, classes, runs (in plan order) and samples, with the
    ``records`` list in place of the table (tests that drop runs filter it first)."""
    runs: list[dict[str, Any]] = []
    records: list[RequestRecord] = []
    sample_map: dict[str, list[dict[str, Any]]] = {}
    for mix, weights in plan.mixtures.items():
        present = [c for c in plan.classes if weights.get(c["name"], 0) > 0]
        n = plan.per_class * len(present)
        step = plan.observation_s * 1e9 / n
        for rate, rps in plan.rates.items():
            for rep in range(plan.repeats):
                for cell in plan.cells:
                    key = f"{cell['cell_id']}-{mix}-{rate}-{rep}"
                    run = {
                        "key": key,
                        "cell": cell["cell_id"],
                        "mixture": mix,
                        "rate": rate,
                        "rate_rps": rps,
                        "repeat": rep,
                        "scenario": "",
                        "status": "done",
                        "trace_sha256": f"t-{mix}-{rate}-{rep}",
                        "corpus_sha256": f"c-{mix}-{rate}-{rep}",
                        "hardware_id": "cpu",
                        "model_revision": "m1",
                        "tokenizer_revision": "t1",
                        "image_digest": "sha256:" + "ab" * 32,
                        "dispatch_lag_p99_ms": 1.0,
                        "warmup_s": plan.warmup_s,
                        "observation_s": plan.observation_s,
                        "drain_deadline_s": plan.drain_deadline_s,
                    }
                    if run_overrides:
                        run_overrides(run)
                    runs.append(run)
                    # Two warm-up requests, then the observed cohort evenly spaced.
                    for i in range(2):
                        records.append(request(key, i, present[0]["name"], int(i * 0.3e9), warmup=True))
                    for j in range(n):
                        cls = present[j % len(present)]["name"]
                        idx = j + 2
                        planned = int(plan.warmup_s * 1e9 + j * step)
                        kw = dict(behaviour(cell["cell_id"], mix, rate, rep, cls, idx))
                        records.append(request(key, idx, cls, planned, **kw))
                    if samples:
                        sample_map[key] = samples(run)
    experiment = {
        "id": 1,
        "name": "test",
        "model_revision": "m1",
        "tokenizer_revision": "t1",
        "generation": {"temperature": 0.0},
        "max_dispatch_lag_ms": 5.0,
        "output_mode": output_mode,
        "mixtures": plan.mixtures,
        "rates": plan.rates,
    }
    return {
        "experiment": experiment,
        "cells": plan.cells,
        "classes": plan.classes,
        "runs": runs,
        "records": records,
        "samples": sample_map,
    }


def healthy(*_: Any) -> dict[str, Any]:
    return {}


def gauges(run: Mapping[str, Any], *, preemptions: float = 0.0) -> list[dict[str, Any]]:
    """Before/after counter samples and a small gauge series for one run."""
    out = []
    for t, phase, frac in ((0, "before", 0.0), (int(11e9), "after", 1.0)):
        out.append(
            {
                "t_ns": t,
                "phase": phase,
                "epoch": 0,
                "name": "vllm:num_preemptions_total",
                "labels": {},
                "kind": "counter",
                "value": 100.0 + preemptions * frac,
                "histogram": None,
            }
        )
    for i in range(5):
        out.append(
            {
                "t_ns": int(i * 2e9),
                "phase": "during",
                "epoch": 0,
                "name": "vllm:num_requests_running",
                "labels": {},
                "kind": "gauge",
                "value": float(i),
                "histogram": None,
            }
        )
    return out


def sequence_of(values: Sequence[Any]) -> list[Any]:
    return list(values)
