"""The request layout of each failure scenario: when each request arrives, its class, lengths,
priority and role (the burst, the backlog, the boundary input...). Pure: no Django.

Each builder takes the experiment's ``ScenarioContext`` and the scenario's sized parameters
(apps/workloads/scenario_sizing.py) and returns the planned requests and the observation
window; apps/workloads/scenario_traces.py turns them into a trace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apps.workloads.generate import GenerateError
from apps.workloads.scenario_sizing import ScenarioContext, long_lengths, short_long

# Priority values (vLLM schedules the lower value first).
HIGH_PRIORITY = 0


@dataclass(frozen=True)
class _Planned:
    t: float
    klass: str
    input_tokens: int
    output_tokens: int
    role: str
    priority: int = 0
    cancel_after_tokens: int | None = None


def _fit(name: str, ctx: ScenarioContext, input_tokens: int, output_tokens: int) -> None:
    if input_tokens < 1 or output_tokens < 1:
        raise GenerateError(f"scenario {name}: token counts must be positive")
    if input_tokens + output_tokens > ctx.max_model_len:
        raise GenerateError(
            f"scenario {name}: {input_tokens} input + {output_tokens} output tokens exceed "
            f"max_model_len {ctx.max_model_len}"
        )


def _steady(rps: float, start: float, end: float) -> list[float]:
    # Constant spacing: the scenario's stress is the burst, not arrival noise.
    n = max(1, math.ceil((end - start) * rps - 1e-9))
    return [start + i / rps for i in range(n) if start + i / rps < end]


def _long_burst(ctx: ScenarioContext, p: Mapping[str, Any]) -> tuple[list[_Planned], float]:
    short, long = short_long(ctx.classes)
    obs = float(p["observation_s"])
    if not p["burst_at_s"] < obs:
        raise GenerateError("scenario long_burst: burst_at_s must fall inside observation_s")
    in_long, out_long = long_lengths(ctx, p)
    _fit("long_burst", ctx, in_long, out_long)
    _fit("long_burst", ctx, int(short["input_tokens"]), int(short["output_tokens"]))
    planned = [
        _Planned(t, str(short["name"]), int(short["input_tokens"]), int(short["output_tokens"]), "steady",
                 int(short.get("priority") or 0))
        for t in _steady(float(p["steady_rps"]), 0.0, obs)
    ]  # fmt: skip
    size = int(p["burst_size"])
    for i in range(size):
        t = float(p["burst_at_s"]) + float(p["burst_spread_s"]) * i / max(1, size)
        planned.append(
            _Planned(t, str(long["name"]), in_long, out_long, "burst", int(long.get("priority") or 0))
        )
    return planned, obs


def _decode_pressure(ctx: ScenarioContext, p: Mapping[str, Any]) -> tuple[list[_Planned], float]:
    short, _ = short_long(ctx.classes)
    n = int(p["concurrency"])
    inp = p["input_tokens"] or int(short["input_tokens"])
    out = int(p["output_tokens"])
    _fit("decode_pressure", ctx, inp, out)
    ramp = float(p["ramp_s"])
    if not ramp < float(p["observation_s"]):
        raise GenerateError("scenario decode_pressure: ramp_s must be shorter than observation_s")
    planned = [
        _Planned(ramp * i / n, str(short["name"]), inp, out, "long_output", int(short.get("priority") or 0))
        for i in range(n)
    ]
    return planned, float(p["observation_s"])


def _context_boundary(ctx: ScenarioContext, p: Mapping[str, Any]) -> tuple[list[_Planned], float]:
    _, long = short_long(ctx.classes)
    out = int(p["output_tokens"])
    at_limit = ctx.max_model_len - out
    if at_limit < 1:
        raise GenerateError("scenario context_boundary: output_tokens must be below max_model_len")
    gap = float(p["gap_s"])
    name, prio = str(long["name"]), int(long.get("priority") or 0)
    planned = [
        _Planned(0.0, name, at_limit, out, "at_limit", prio),
        # One token past the window: vLLM must refuse it with an error the record keeps.
        _Planned(gap, name, at_limit + 1, out, "past_limit", prio),
    ]
    return planned, 2 * gap


def _cancellation(ctx: ScenarioContext, p: Mapping[str, Any]) -> tuple[list[_Planned], float]:
    short, _ = short_long(ctx.classes)
    out = p["output_tokens"] or max(int(short["output_tokens"]), 16)
    inp = int(short["input_tokens"])
    _fit("cancellation", ctx, inp, out)
    cancel_at = p["cancel_after_tokens"] or max(1, out // 2)
    if cancel_at >= out:
        raise GenerateError("scenario cancellation: cancel_after_tokens must be below output_tokens")
    times = _steady(float(p["rps"]), 0.0, float(p["observation_s"]))
    # Every k-th request cancels, evenly spread: the share is exact, not a draw.
    marks = _spread(len(times), float(p["share"]))
    planned = []
    for i, t in enumerate(times):
        cancel = i in marks
        planned.append(
            _Planned(t, str(short["name"]), inp, out, "cancel" if cancel else "complete",
                     int(short.get("priority") or 0), cancel_at if cancel else None)
        )  # fmt: skip
    return planned, float(p["observation_s"])


def _spread(n: int, share: float) -> set[int]:
    k = round(n * share)
    if k <= 0:
        return set()
    return {math.floor(j * n / k) for j in range(k)}


def _kv_pressure(ctx: ScenarioContext, p: Mapping[str, Any]) -> tuple[list[_Planned], float]:
    """Size the requests so that their prompts fit the cache together but their outputs do not.

    With C tokens of KV cache, n requests and pressure f: every prompt has
    0.7 C / n tokens (all admitted at once), every output f C / n - input, so
    n sequences grow to f x C tokens: more than the cache, and the scheduler
    must preempt some to let the others grow.
    """
    _, long = short_long(ctx.classes)
    cap = p["kv_capacity_tokens"] or ctx.kv_capacity_tokens
    if not cap:
        raise GenerateError(
            "scenario kv_pressure needs the KV cache size: set controls.kv_cache_memory_bytes "
            "or scenarios.kv_pressure.kv_capacity_tokens"
        )
    n = int(p["requests"])
    pressure = float(p["pressure"])
    if pressure <= 1:
        raise GenerateError("scenario kv_pressure: pressure must exceed 1 (more context than the cache)")
    inp = max(1, int(0.7 * cap / n))
    out = max(1, int(pressure * cap / n) - inp)
    _fit("kv_pressure", ctx, inp, out)
    spread = float(p["spread_s"])
    planned = [
        _Planned(spread * i / n, str(long["name"]), inp, out, "pressure", int(long.get("priority") or 0))
        for i in range(n)
    ]
    return planned, max(spread, 1.0)


def _priority_flood(ctx: ScenarioContext, p: Mapping[str, Any]) -> tuple[list[_Planned], float]:
    short, _ = short_long(ctx.classes)
    inp = int(short["input_tokens"])
    low = int(p["low_priority"]) if ctx.send_priority else 0
    high = HIGH_PRIORITY
    if ctx.send_priority and low <= high:
        raise GenerateError("scenario priority_flood: low_priority must be above 0 (vLLM serves lower first)")
    _fit("priority_flood", ctx, inp, int(p["backlog_output_tokens"]))
    _fit("priority_flood", ctx, inp, int(p["flood_output_tokens"]))
    name = str(short["name"])
    backlog = int(p["backlog"])
    planned = [
        _Planned(0.05 * i / backlog, name, inp, int(p["backlog_output_tokens"]), "backlog", low)
        for i in range(backlog)
    ]
    start = float(p["flood_at_s"])
    rate = float(p["flood_rps"])
    flood = int(p["flood"])
    planned += [
        _Planned(start + i / rate, name, inp, int(p["flood_output_tokens"]), "flood", high)
        for i in range(flood)
    ]
    return planned, start + flood / rate


BUILDERS = {
    "long_burst": _long_burst,
    "decode_pressure": _decode_pressure,
    "context_boundary": _context_boundary,
    "cancellation": _cancellation,
    "kv_pressure": _kv_pressure,
    "priority_flood": _priority_flood,
}
# The one list of the failure scenarios: each has a generator here, and apps/analysis/scenario_checks.py
# reads this list to find each one's check (``_<name>`` there; a missing one fails its import).
SCENARIOS = tuple(BUILDERS)
