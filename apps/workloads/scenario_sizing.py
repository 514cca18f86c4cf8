"""A failure scenario's parameters and sizes: the defaults, the spec's overrides, the sizes
derived from B0's measured decode pace and the run's windows. Pure: no Django.

The traces themselves are apps/workloads/scenario_traces.py (docs/SCENARIOS.md in prose); the
request layout of each scenario is apps/workloads/scenario_layouts.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apps.workloads.generate import GenerateError

# The automatic priority verification replays a short priority_flood.
PRIORITY_CHECK = "priority_check"

# Parameters each scenario accepts, with defaults. None: derived from the
# experiment (classes, max_model_len, KV cache) when not given.
DEFAULTS: dict[str, dict[str, Any]] = {
    "long_burst": {
        "steady_rps": 2.0,
        "observation_s": 20.0,
        "burst_at_s": 5.0,
        "burst_size": None,
        "burst_spread_s": 0.2,
        "long_input_tokens": None,
        "long_output_tokens": None,
        "drain_deadline_s": 10.0,
        "overload": 3.0,
    },
    "decode_pressure": {
        "concurrency": 8,
        "output_tokens": None,
        "input_tokens": None,
        "ramp_s": 1.0,
        "observation_s": 5.0,
        "drain_deadline_s": 60.0,
        "overload": 3.0,
    },
    "context_boundary": {
        "output_tokens": 8,
        "gap_s": 2.0,
        "drain_deadline_s": 30.0,
    },
    "cancellation": {
        "rps": 2.0,
        "observation_s": 10.0,
        "share": 0.5,
        "output_tokens": None,
        "cancel_after_tokens": None,
        "drain_deadline_s": 30.0,
    },
    "kv_pressure": {
        "requests": 6,
        "kv_capacity_tokens": None,
        "pressure": 1.5,
        "spread_s": 0.3,
        "drain_deadline_s": 120.0,
    },
    "priority_flood": {
        "backlog": None,
        # Long enough that most of the backlog still waits when the flood arrives.
        "backlog_output_tokens": None,
        "flood": 12,
        "flood_at_s": 1.0,
        "flood_rps": 4.0,
        "flood_output_tokens": None,
        "low_priority": 10,
        "drain_deadline_s": 60.0,
        "overload": 3.0,
    },
}
DEFAULTS[PRIORITY_CHECK] = {**DEFAULTS["priority_flood"], "flood": 6}
# What a derived size falls back to when B0's decode pace is not known (no probe ran).
FALLBACK = {"burst_size": 8, "backlog": 12, "backlog_output_tokens": 256, "flood_output_tokens": 16}
FALLBACK_OF = {PRIORITY_CHECK: {**FALLBACK, "backlog": 8}}
# Under priority the flood holds the freed slots while it decodes, and the waiting backlog
# starts only after it: the flood must decode at least this long (x overload) so the
# backlog's first tokens trail the flood's by more than the check's 50 ms margin.
FLOOD_LEAD_S = 0.1
# Below this many output tokens a backlog cannot outlast anything: the KV-cache fit is then given up.
MIN_BACKLOG_OUTPUT_TOKENS = 16
# Derived request counts never exceed this (a trace of thousands of long prompts is a mistake).
MAX_DERIVED_REQUESTS = 1024
GENERATORS_OF = {PRIORITY_CHECK: "priority_flood"}

# Which parameters must be whole numbers (the rest are seconds, rates or shares).
_INTEGER = {
    "burst_size",
    "long_input_tokens",
    "long_output_tokens",
    "concurrency",
    "output_tokens",
    "input_tokens",
    "cancel_after_tokens",
    "requests",
    "kv_capacity_tokens",
    "backlog",
    "backlog_output_tokens",
    "flood",
    "flood_output_tokens",
    "low_priority",
}


@dataclass(frozen=True)
class ScenarioContext:
    """What a scenario needs from its experiment."""

    classes: Sequence[Mapping[str, Any]]
    max_model_len: int
    seed: int
    tokenizer_revision: str
    kv_capacity_tokens: int | None = None
    # False: every priority 0 (a server that refuses the field under FCFS).
    send_priority: bool = True
    # B0's measured decode pace (ms per output token of one stream) and where it
    # was measured; None: not measured, derived sizes fall back to fixed counts.
    decode_step_ms: float | None = None
    pace_source: str | None = None
    # B0's --max-num-seqs (None: not set in its args).
    max_num_seqs: int | None = None


def scenario_params(name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The scenario's parameters: defaults overlaid with ``params``; unknown names refused."""
    if name not in DEFAULTS:
        raise GenerateError(f"unknown scenario {name!r} (known: {', '.join(sorted(DEFAULTS))})")
    given = dict(params or {})
    unknown = sorted(set(given) - set(DEFAULTS[name]))
    if unknown:
        raise GenerateError(f"scenario {name}: unknown parameter(s) {', '.join(unknown)}")
    out = dict(DEFAULTS[name])
    for key, value in given.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GenerateError(f"scenario {name}: {key} must be a number, got {value!r}")
        if key in _INTEGER and not float(value).is_integer():
            raise GenerateError(f"scenario {name}: {key} must be a whole number, got {value!r}")
        if value < 0 or (value == 0 and key not in {"burst_at_s", "flood_at_s", "low_priority", "spread_s"}):
            raise GenerateError(f"scenario {name}: {key} must be positive, got {value!r}")
        out[key] = int(value) if key in _INTEGER else float(value)
    if name in ("cancellation",) and out["share"] > 1:
        raise GenerateError(f"scenario {name}: share must be at most 1, got {out['share']!r}")
    if "overload" in out and out["overload"] <= 1:
        raise GenerateError(f"scenario {name}: overload must exceed 1, got {out['overload']!r}")
    return out


def kv_capacity_tokens(*, model_config: Mapping[str, Any], kv_cache_memory_bytes: int | None) -> int | None:
    """Tokens the KV cache holds: bytes / (2 x layers x kv heads x head dim x dtype bytes).

    None when the experiment does not fix the KV cache size (it then depends
    on the device's free memory, which no generator can know).
    """
    if not kv_cache_memory_bytes:
        return None
    try:
        layers = int(model_config["num_hidden_layers"])
        heads = int(model_config.get("num_key_value_heads") or model_config["num_attention_heads"])
        head_dim = int(
            model_config.get("head_dim") or model_config["hidden_size"] // model_config["num_attention_heads"]
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    dtype = str(model_config.get("torch_dtype") or "bfloat16")
    width = 4 if dtype in ("float32", "float") else 2
    per_token = 2 * layers * heads * head_dim * width
    return int(kv_cache_memory_bytes) // per_token if per_token > 0 else None


def short_long(classes: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    if not classes:
        raise GenerateError("a scenario needs at least one request class")
    ordered = sorted(classes, key=lambda c: (int(c["input_tokens"]), str(c["name"])))
    return ordered[0], ordered[-1]


def _running_bound(ctx: ScenarioContext, context_tokens: int) -> int | None:
    """Most sequences of ``context_tokens`` each that can run at once (None: nothing bounds it here)."""
    bounds = [int(ctx.max_num_seqs)] if ctx.max_num_seqs else []
    if ctx.kv_capacity_tokens:
        bounds.append(max(1, int(ctx.kv_capacity_tokens) // max(1, context_tokens)))
    return min(bounds) if bounds else None


def long_lengths(ctx: ScenarioContext, p: Mapping[str, Any]) -> tuple[int, int]:
    """(input, output) tokens of the long burst's requests: the parameters, else the long class within the window."""
    _, long = short_long(ctx.classes)
    out_long = p["long_output_tokens"] or int(long["output_tokens"])
    in_long = p["long_input_tokens"] or min(int(long["input_tokens"]), ctx.max_model_len - out_long)
    return int(in_long), int(out_long)


def _derived(value: int, rule: str, **inputs: Any) -> dict[str, Any]:
    return {"value": value, "rule": rule, "inputs": inputs}


def scenario_sizing(
    name: str, ctx: ScenarioContext, p: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fill the sizes left to derivation (None) from B0's measured pace; returns (params, how).

    A scenario only tests what it claims if its stress outlasts its window on
    the engine at hand: a burst a fast server clears before the drain deadline
    shows nothing. So the sizes that decide that are derived from B0's decode
    pace ``decode_step_ms`` (measured by the capacity probe or the pace run),
    with a safety factor ``overload``:

    - long_burst ``burst_size``: at most R long sequences run at once (R from
      max_num_seqs and the KV cache over the long prompt), each needs
      ``long_output_tokens`` decode steps, so N requests need at least
      ceil(N / R) x out x step; N is the smallest multiple of R for which that
      is ``overload`` x the time from the burst to the drain deadline.
    - priority_flood ``backlog_output_tokens``: the first wave of the backlog
      must still be decoding ``overload`` x the flood's last arrival, so the
      rest of the backlog still waits when the flood comes, yet fit the KV
      cache whole; ``backlog``: 3 x the sequences that can run at once (two
      waves wait); ``flood_output_tokens``: the flood holds the freed slots
      ``overload`` x ``FLOOD_LEAD_S``, so the backlog's next first tokens trail.
    - decode_pressure ``output_tokens``: every stream lasts ``overload`` x the
      ramp, so they overlap.

    Without a measured pace the fixed fallbacks (``FALLBACK``) are used and
    ``how["measured"]`` is False: the verdict then says the scenario was not
    sized for this engine. Sizes given in the spec are kept as they are.
    """
    kind = GENERATORS_OF.get(name, name)
    out = dict(p)
    how: dict[str, Any] = {
        "decode_step_ms": ctx.decode_step_ms,
        "pace_source": ctx.pace_source,
        "measured": bool(ctx.decode_step_ms),
        "derived": {},
    }
    sizer = _Sizer(
        ctx=ctx,
        out=out,
        derived=how["derived"],
        step_s=float(ctx.decode_step_ms) / 1000.0 if ctx.decode_step_ms else None,
        fallback=FALLBACK_OF.get(name, FALLBACK),
        overload=float(p.get("overload") or 1.0),
    )
    short, _ = short_long(ctx.classes)
    if kind == "long_burst" and out["burst_size"] is None:
        sizer.long_burst()
    elif kind == "priority_flood":
        sizer.priority_flood(int(short["input_tokens"]))
    elif kind == "decode_pressure" and out["output_tokens"] is None:
        sizer.decode_pressure(short)
    return out, how


@dataclass
class _Sizer:
    """The steps of ``scenario_sizing``: each fills one scenario's sizes left to derivation in
    ``out`` and says how in ``derived``."""

    ctx: ScenarioContext
    out: dict[str, Any]
    derived: dict[str, Any]
    step_s: float | None  # B0's decode step in seconds; None: not measured
    fallback: Mapping[str, int]
    overload: float

    def fixed(self, key: str) -> None:
        self.out[key] = self.fallback[key]
        self.derived[key] = _derived(self.out[key], "fixed fallback: B0's decode pace was not measured")

    def long_burst(self) -> None:
        ctx, out, step_s, overload = self.ctx, self.out, self.step_s, self.overload
        in_long, out_long = long_lengths(ctx, out)
        running = _running_bound(ctx, in_long)
        window = float(out["observation_s"]) - float(out["burst_at_s"]) + float(out["drain_deadline_s"])
        if step_s and running:
            rounds = math.ceil(overload * window / (out_long * step_s))
            n = min(MAX_DERIVED_REQUESTS, max(running + 1, running * rounds))
            out["burst_size"] = n
            self.derived["burst_size"] = _derived(
                n,
                "running x ceil(overload x (observation_s - burst_at_s + drain_deadline_s) / "
                "(long_output_tokens x decode_step_ms))",
                running=running,
                window_s=round(window, 6),
                long_output_tokens=out_long,
                capped=n == MAX_DERIVED_REQUESTS,
            )
        else:
            self.fixed("burst_size")

    def priority_flood(self, inp: int) -> None:
        """``inp``: the short class's input tokens (the backlog's and the flood's prompt)."""
        ctx, out = self.ctx, self.out
        # Admission needs only the prompt in the KV cache, so the prompt bounds how many start.
        starting = _running_bound(ctx, inp)
        if out["backlog_output_tokens"] is None:
            self._backlog_output_tokens(inp, starting)
        if out["flood_output_tokens"] is None:
            if self.step_s:
                lead = max(
                    FALLBACK["flood_output_tokens"], math.ceil(self.overload * FLOOD_LEAD_S / self.step_s)
                )
                flood_tokens = min(ctx.max_model_len - inp, lead)
                out["flood_output_tokens"] = flood_tokens
                self.derived["flood_output_tokens"] = _derived(
                    flood_tokens,
                    "max(16, ceil(overload x 0.1 s / decode_step_ms)): the flood decodes long enough "
                    "that the backlog's next first tokens trail its own",
                )
            else:
                self.fixed("flood_output_tokens")
        if out["backlog"] is None:
            if starting and ctx.max_num_seqs:
                n = min(MAX_DERIVED_REQUESTS, 3 * starting)
                out["backlog"] = n
                self.derived["backlog"] = _derived(
                    n, "3 x the sequences that can run at once", running=starting
                )
            else:
                self.fixed("backlog")

    def _backlog_output_tokens(self, inp: int, starting: int | None) -> None:
        ctx, out = self.ctx, self.out
        room = ctx.max_model_len - inp
        # The first wave must fit the KV cache whole: preemption would reorder
        # the backlog by itself, and the check is about the policy's order.
        if ctx.kv_capacity_tokens and ctx.max_num_seqs and starting:
            kv_room = int(ctx.kv_capacity_tokens) // starting - inp
            if kv_room >= MIN_BACKLOG_OUTPUT_TOKENS:
                room = min(room, kv_room)
        flood_end = float(out["flood_at_s"]) + int(out["flood"]) / float(out["flood_rps"])
        if self.step_s:
            want = math.ceil(self.overload * flood_end / self.step_s)
            tokens = max(1, min(room, want))
            out["backlog_output_tokens"] = tokens
            self.derived["backlog_output_tokens"] = _derived(
                tokens,
                "ceil(overload x (flood_at_s + flood / flood_rps) / decode_step_ms), at most "
                "max_model_len - input and what lets the first wave fit the KV cache",
                flood_end_s=round(flood_end, 6),
                room=room,
                capped=want > room,
            )
        else:
            self.fixed("backlog_output_tokens")

    def decode_pressure(self, short: Mapping[str, Any]) -> None:
        ctx, out = self.ctx, self.out
        inp = out["input_tokens"] or int(short["input_tokens"])
        room = ctx.max_model_len - inp
        base = max(int(short["output_tokens"]) * 4, min(512, room))
        if self.step_s:
            want = math.ceil(self.overload * float(out["ramp_s"]) / self.step_s)
            tokens = max(1, min(room, max(base, want)))
            out["output_tokens"] = tokens
            self.derived["output_tokens"] = _derived(
                tokens,
                "max(4 x short output or min(512, room), ceil(overload x ramp_s / decode_step_ms)), "
                "at most max_model_len - input",
                capped=want > room,
            )
        else:
            out["output_tokens"] = base
            self.derived["output_tokens"] = _derived(base, "4 x short output, at least min(512, room)")


def scenario_windows(name: str, params: Mapping[str, Any] | None = None) -> dict[str, float]:
    """warmup_s, observation_s and drain_deadline_s of a scenario run, from its parameters alone.

    The server is warmed up by the pipeline before every run, so scenario
    traces have no warm-up of their own: every request counts.
    """
    p = scenario_params(name, params)
    kind = GENERATORS_OF.get(name, name)
    if kind == "context_boundary":
        obs = 2 * float(p["gap_s"])
    elif kind == "kv_pressure":
        obs = max(float(p["spread_s"]), 1.0)
    elif kind == "priority_flood":
        obs = float(p["flood_at_s"]) + int(p["flood"]) / float(p["flood_rps"])
    else:
        obs = float(p["observation_s"])
    return {"warmup_s": 0.0, "observation_s": obs, "drain_deadline_s": float(p["drain_deadline_s"])}
