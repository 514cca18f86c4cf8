"""Failure-scenario traces: the traffic every decision must survive.

Pure: no Django. Each scenario is a generator of canonical traces (the same
format as the sweep's, see docs/TRACES.md) built from the experiment's
classes, tokenizer and seed, so a scenario trace is hashed, stored once and
replayed by the same pipeline as any other run. The meta of every scenario
trace names the role of each request (``meta.roles``: role -> indices), so
the checks in apps/analysis/scenario_checks.py know which requests were the burst,
the backlog or the boundary input without guessing from timings.

Scenarios (parameters and defaults in ``DEFAULTS``, prose in docs/SCENARIOS.md):

- ``long_burst``: steady short traffic, and a burst of long prompts arriving
  together in the middle of it.
- ``decode_pressure``: many long outputs in flight at once.
- ``context_boundary``: one input of exactly max_model_len - output tokens and
  one a token past it (the server must refuse that one; the run must not crash).
- ``cancellation``: steady traffic where a share of the streams carry
  ``cancel_after_tokens`` (the client disconnects mid-response).
- ``kv_pressure``: enough concurrent context to overflow the KV cache, so the
  scheduler has to preempt.
- ``priority_flood``: a low-priority backlog, then a sustained flood of
  high-priority arrivals (vLLM serves lower priority values first). The same
  trace runs against every cell: under FCFS the priorities must change
  nothing, under ``--scheduling-policy priority`` the flood must overtake.
  ``send_priority=False`` builds a variant with every priority 0, for
  servers that refuse the field.

The parameters and the sizes derived from B0's pace are apps/workloads/scenario_sizing.py,
each scenario's request layout apps/workloads/scenario_layouts.py; both are importable from
here, the one place that builds a scenario's trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from apps.workloads.generate import GenerateError
from apps.workloads.prompts import PromptTokenizer, build_prompts, corpus_sha256, stable_seed
from apps.workloads.scenario_layouts import BUILDERS, HIGH_PRIORITY, SCENARIOS
from apps.workloads.scenario_sizing import (
    DEFAULTS,
    FALLBACK,
    FALLBACK_OF,
    FLOOD_LEAD_S,
    GENERATORS_OF,
    MAX_DERIVED_REQUESTS,
    MIN_BACKLOG_OUTPUT_TOKENS,
    PRIORITY_CHECK,
    ScenarioContext,
    kv_capacity_tokens,
    scenario_params,
    scenario_sizing,
    scenario_windows,
)
from apps.workloads.tracefile import T_DECIMALS, Trace, TraceRequest

__all__ = [
    "DEFAULTS",
    "FALLBACK",
    "FALLBACK_OF",
    "FLOOD_LEAD_S",
    "GENERATOR",
    "GENERATORS_OF",
    "HIGH_PRIORITY",
    "MAX_DERIVED_REQUESTS",
    "MIN_BACKLOG_OUTPUT_TOKENS",
    "PRIORITY_CHECK",
    "SCENARIOS",
    "ScenarioContext",
    "kv_capacity_tokens",
    "offered_rate",
    "scenario_params",
    "scenario_sizing",
    "scenario_trace",
    "scenario_windows",
]

GENERATOR = "tailtune.workloads.scenarios/1"


def scenario_trace(
    *,
    name: str,
    context: ScenarioContext,
    params: Mapping[str, Any] | None = None,
    tokenizer_dir: str | Path | None = None,
    tokenizer: PromptTokenizer | None = None,
) -> Trace:
    """The canonical trace of one scenario for one experiment.

    Steps: 1. overlay the parameters on the defaults; 2. derive the sizes
    left open from B0's measured pace (:func:`scenario_sizing`); 3. lay out
    the requests (times, classes, lengths, roles) with the scenario's
    builder; 4. sort by time (stable, so ties keep the layout's order) and
    number them; 5. one exact-length prompt per request from the experiment
    seed; 6. the meta names every role's indices, the parameters used and how
    the derived ones were sized.
    """
    kind = GENERATORS_OF.get(name, name)
    p, sizing = scenario_sizing(name, context, scenario_params(name, params))
    planned, observation_s = BUILDERS[kind](context, p)
    planned.sort(key=lambda r: r.t)
    seed = stable_seed("scenario", int(context.seed), name, int(context.send_priority))
    if tokenizer is None:
        if tokenizer_dir is None:
            raise GenerateError("scenario_trace needs tokenizer_dir or tokenizer")
        tokenizer = PromptTokenizer(tokenizer_dir)
    prompts = build_prompts(
        tokenizer=tokenizer, requests=[(r.klass, r.input_tokens, 0) for r in planned], seed=seed
    )
    roles: dict[str, list[int]] = {}
    requests = []
    for i, (r, prompt) in enumerate(zip(planned, prompts, strict=True)):
        roles.setdefault(r.role, []).append(i)
        requests.append(
            TraceRequest(
                index=i,
                t_offset_s=round(float(r.t), T_DECIMALS),
                klass=r.klass,
                input_tokens=r.input_tokens,
                output_tokens=r.output_tokens,
                priority=r.priority,
                warmup=False,
                prompt_token_ids=prompt,
                cancel_after_tokens=r.cancel_after_tokens,
                scenario=name,
            )
        )
    windows = scenario_windows(name, params)
    meta = {
        "generator": GENERATOR,
        "kind": "scenario",
        "scenario": name,
        "scenario_kind": kind,
        "params": p,
        "sizing": sizing,
        "roles": roles,
        "send_priority": bool(context.send_priority),
        "max_model_len": int(context.max_model_len),
        "kv_capacity_tokens": context.kv_capacity_tokens,
        "tokenizer_revision": context.tokenizer_revision,
        "tokenizer_sha256": tokenizer.sha256,
        "seed": int(context.seed),
        "trace_seed": seed,
        "warmup_s": windows["warmup_s"],
        "observation_s": round(max(observation_s, windows["observation_s"]), T_DECIMALS),
        "drain_deadline_s": windows["drain_deadline_s"],
        "classes": sorted({r.klass for r in planned}),
        "corpus_sha256": corpus_sha256(prompts),
        "requests": len(requests),
        "synthetic_output": True,
        "prompt_encoding": "token_ids_without_special_tokens",
    }
    return Trace(meta=meta, requests=requests)


def offered_rate(trace: Trace) -> float:
    """Requests per second over the trace's observation window (what Run.rate_rps records)."""
    obs = float(trace.meta.get("observation_s") or 0.0)
    return round(len(trace.requests) / obs, 6) if obs > 0 else 0.0
