"""Scenario trace generators: shapes, roles, determinism and refusals (no engine)."""

from __future__ import annotations

import math

import pytest

from apps.workloads.generate import GenerateError
from apps.workloads.scenario_traces import (
    FALLBACK,
    MAX_DERIVED_REQUESTS,
    PRIORITY_CHECK,
    SCENARIOS,
    ScenarioContext,
    kv_capacity_tokens,
    scenario_params,
    scenario_trace,
    scenario_windows,
)
from apps.workloads.tracefile import trace_dumps, trace_loads, trace_sha256


@pytest.mark.parametrize("name", [*SCENARIOS, PRIORITY_CHECK])
def test_it_builds_a_canonical_hashed_trace_with_roles_for_every_scenario(name, context, tokenizer) -> None:
    trace = scenario_trace(name=name, context=context, tokenizer=tokenizer)
    data = trace_dumps(trace)
    assert trace_dumps(trace_loads(data)) == data
    assert trace.meta["kind"] == "scenario" and trace.meta["scenario"] == name
    indices = sorted(i for idx in trace.meta["roles"].values() for i in idx)
    assert indices == list(range(len(trace.requests)))
    assert all(r.scenario == name and not r.warmup for r in trace.requests)
    obs = trace.meta["observation_s"]
    assert all(r.t_offset_s < obs for r in trace.requests)
    assert obs == scenario_windows(name)["observation_s"]
    again = scenario_trace(name=name, context=context, tokenizer=tokenizer)
    assert trace_sha256(trace_dumps(again)) == trace_sha256(data)


def test_it_bursts_long_prompts_together_on_top_of_steady_short_traffic(context, tokenizer) -> None:
    t = scenario_trace(name="long_burst", context=context, tokenizer=tokenizer, params={"burst_size": 5})
    burst = [t.requests[i] for i in t.meta["roles"]["burst"]]
    steady = [t.requests[i] for i in t.meta["roles"]["steady"]]
    assert len(burst) == 5 and {r.klass for r in burst} == {"long"}
    assert max(r.t_offset_s for r in burst) - min(r.t_offset_s for r in burst) < 0.2
    assert all(r.input_tokens == 1024 for r in burst)
    assert {r.klass for r in steady} == {"short"} and len(steady) == 40  # 2 req/s over 20 s
    assert steady[0].t_offset_s < burst[0].t_offset_s < steady[-1].t_offset_s


def test_it_puts_one_input_exactly_at_the_context_window_and_one_past_it(context, tokenizer) -> None:
    t = scenario_trace(
        name="context_boundary", context=context, tokenizer=tokenizer, params={"output_tokens": 4}
    )
    at = t.requests[t.meta["roles"]["at_limit"][0]]
    past = t.requests[t.meta["roles"]["past_limit"][0]]
    assert at.input_tokens + at.output_tokens == 2048
    assert past.input_tokens + past.output_tokens == 2049
    assert len(past.prompt_token_ids) == past.input_tokens


def test_it_marks_the_configured_share_of_streams_to_cancel(context, tokenizer) -> None:
    t = scenario_trace(
        name="cancellation", context=context, tokenizer=tokenizer, params={"share": 0.25, "output_tokens": 20}
    )
    cancel = [r for r in t.requests if r.cancel_after_tokens is not None]
    assert len(cancel) == 5 and len(t.requests) == 20
    assert all(r.cancel_after_tokens == 10 < r.output_tokens for r in cancel)
    assert sorted(t.meta["roles"]["cancel"]) == sorted(r.index for r in cancel)


def test_it_sizes_kv_pressure_to_overflow_the_cache_with_prompts_that_fit(context, tokenizer) -> None:
    t = scenario_trace(name="kv_pressure", context=context, tokenizer=tokenizer)
    total_prompt = sum(r.input_tokens for r in t.requests)
    total_context = sum(r.input_tokens + r.output_tokens for r in t.requests)
    assert total_prompt < 2048 < total_context
    assert total_context >= 1.45 * 2048
    assert max(r.t_offset_s for r in t.requests) < 0.5


def test_it_refuses_kv_pressure_without_a_known_cache_size(tokenizer) -> None:
    ctx = ScenarioContext(
        classes=[{"name": "a", "input_tokens": 8, "output_tokens": 8}],
        max_model_len=512,
        seed=1,
        tokenizer_revision="r",
    )
    with pytest.raises(GenerateError, match="kv_cache_memory_bytes"):
        scenario_trace(name="kv_pressure", context=ctx, tokenizer=tokenizer)


def test_it_floods_high_priority_after_a_low_priority_backlog(context, tokenizer) -> None:
    t = scenario_trace(
        name="priority_flood", context=context, tokenizer=tokenizer, params={"backlog": 4, "flood": 3}
    )
    backlog = [t.requests[i] for i in t.meta["roles"]["backlog"]]
    flood = [t.requests[i] for i in t.meta["roles"]["flood"]]
    assert [r.priority for r in backlog] == [10] * 4 and [r.priority for r in flood] == [0] * 3
    assert max(r.t_offset_s for r in backlog) < min(r.t_offset_s for r in flood)
    flat = ScenarioContext(**{**context.__dict__, "send_priority": False})
    same = scenario_trace(
        name="priority_flood", context=flat, tokenizer=tokenizer, params={"backlog": 4, "flood": 3}
    )
    assert {r.priority for r in same.requests} == {0}


def test_it_keeps_many_long_outputs_in_flight_under_decode_pressure(context, tokenizer) -> None:
    t = scenario_trace(
        name="decode_pressure", context=context, tokenizer=tokenizer, params={"concurrency": 5}
    )
    assert len(t.requests) == 5 and all(r.output_tokens >= 32 for r in t.requests)
    assert max(r.t_offset_s for r in t.requests) < 1.0


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nope", {}, "unknown scenario"),
        ("long_burst", {"burst_sise": 3}, "unknown parameter"),
        ("long_burst", {"burst_size": 2.5}, "whole number"),
        ("long_burst", {"steady_rps": -1}, "positive"),
        ("cancellation", {"share": 1.5}, "at most 1"),
        ("long_burst", {"overload": 1}, "overload must exceed 1"),
    ],
)
def test_it_names_the_bad_parameter(name, params, message) -> None:
    with pytest.raises(GenerateError, match=message):
        scenario_params(name, params)


def test_it_refuses_a_scenario_that_cannot_fit_the_context(tokenizer) -> None:
    ctx = ScenarioContext(
        classes=[{"name": "a", "input_tokens": 8, "output_tokens": 8}],
        max_model_len=64,
        seed=1,
        tokenizer_revision="r",
    )
    with pytest.raises(GenerateError, match="max_model_len"):
        scenario_trace(
            name="decode_pressure", context=ctx, tokenizer=tokenizer, params={"output_tokens": 100}
        )


def test_it_derives_the_kv_capacity_from_the_model_config() -> None:
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "torch_dtype": "bfloat16",
    }
    # 2 (K and V) x 2 layers x 4 heads x 32 x 2 bytes = 1024 bytes per token.
    assert kv_capacity_tokens(model_config=config, kv_cache_memory_bytes=6 * 1024 * 1024) == 6144
    assert kv_capacity_tokens(model_config=config, kv_cache_memory_bytes=None) is None


def _paced(context: ScenarioContext, step_ms: float, **extra: object) -> ScenarioContext:
    return ScenarioContext(
        **{**context.__dict__, "decode_step_ms": step_ms, "pace_source": "probe run x", **extra}
    )


@pytest.mark.parametrize("step_ms", [0.5, 2.0, 20.0])
def test_it_sizes_the_long_burst_to_outlast_its_window_at_the_measured_pace(
    step_ms, context, tokenizer
) -> None:
    ctx = _paced(context, step_ms, max_num_seqs=6)
    params = {"observation_s": 4, "burst_at_s": 1, "drain_deadline_s": 1, "long_output_tokens": 400}
    t = scenario_trace(name="long_burst", context=ctx, tokenizer=tokenizer, params=params)
    n = len(t.meta["roles"]["burst"])
    # 2048 KV tokens hold at most 2 prompts of 1024 (6 sequence slots do not bind).
    running = 2
    assert n % running == 0 and n > running
    least_s = math.ceil(n / running) * 400 * step_ms / 1000
    assert least_s >= 3.0 * (4 - 1 + 1) or n == MAX_DERIVED_REQUESTS
    sized = t.meta["sizing"]
    assert sized["measured"] and sized["decode_step_ms"] == step_ms
    assert sized["derived"]["burst_size"]["value"] == n == t.meta["params"]["burst_size"]
    assert sized["derived"]["burst_size"]["inputs"]["running"] == running


def test_it_keeps_a_size_given_in_the_spec_and_falls_back_without_a_pace(context, tokenizer) -> None:
    given = scenario_trace(
        name="long_burst", context=_paced(context, 1.0), tokenizer=tokenizer, params={"burst_size": 5}
    )
    assert len(given.meta["roles"]["burst"]) == 5 and "burst_size" not in given.meta["sizing"]["derived"]
    unpaced = scenario_trace(name="long_burst", context=context, tokenizer=tokenizer)
    assert len(unpaced.meta["roles"]["burst"]) == FALLBACK["burst_size"]
    assert not unpaced.meta["sizing"]["measured"]
    assert unpaced.meta["sizing"]["derived"]["burst_size"]["rule"].startswith("fixed fallback")


def test_it_sizes_the_priority_backlog_to_still_wait_when_the_flood_arrives(context, tokenizer) -> None:
    ctx = _paced(context, 2.0, max_num_seqs=6)
    params = {"flood": 6, "flood_at_s": 0.2, "flood_rps": 20}
    t = scenario_trace(name="priority_flood", context=ctx, tokenizer=tokenizer, params=params)
    backlog = [t.requests[i] for i in t.meta["roles"]["backlog"]]
    # Prompts of 64 tokens: the 6 slots bind, so three waves of 6.
    assert len(backlog) == 18
    out = backlog[0].output_tokens
    flood_end = 0.2 + 6 / 20
    # 3 x 0.5 s at 2 ms a token asks for 750 tokens, but the first wave of 6 must fit the
    # 2048-token KV cache whole (6 x (64 + out) <= 2048): 277 tokens, and it says so.
    derived = t.meta["sizing"]["derived"]["backlog_output_tokens"]
    assert math.ceil(3.0 * flood_end / 0.002) == 750
    assert out == 2048 // 6 - 64 == derived["inputs"]["room"] and derived["inputs"]["capped"]
    roomy = _paced(context, 2.0, max_num_seqs=6, kv_capacity_tokens=8192)
    t = scenario_trace(name="priority_flood", context=roomy, tokenizer=tokenizer, params=params)
    out = t.requests[t.meta["roles"]["backlog"][0]].output_tokens
    assert out * 2.0 / 1000 >= 3.0 * flood_end and out == 750
    # At a pace the context cannot hold, the size stops at the room left and says so.
    slow = scenario_trace(name="priority_flood", context=_paced(context, 0.01), tokenizer=tokenizer)
    derived = slow.meta["sizing"]["derived"]["backlog_output_tokens"]
    assert derived["value"] == 2048 - 64 and derived["inputs"]["capped"]
    # The priority check keeps its own fallback backlog when nothing bounds the running sequences.
    check = scenario_trace(name=PRIORITY_CHECK, context=context, tokenizer=tokenizer)
    assert len(check.meta["roles"]["backlog"]) == 8 and len(check.meta["roles"]["flood"]) == 6


def test_it_makes_decode_pressure_streams_outlast_their_ramp(context, tokenizer) -> None:
    t = scenario_trace(
        name="decode_pressure",
        context=_paced(context, 0.5),
        tokenizer=tokenizer,
        params={"concurrency": 4, "ramp_s": 1.0},
    )
    assert {r.output_tokens for r in t.requests} == {2048 - 64}
    assert t.meta["sizing"]["derived"]["output_tokens"]["inputs"]["capped"]


def test_every_failure_scenario_has_one_generator_one_check_and_its_defaults():
    from apps.analysis.scenario_checks import _CHECKS
    from apps.workloads.scenario_traces import DEFAULTS

    assert tuple(_CHECKS) == SCENARIOS
    assert set(DEFAULTS) == {*SCENARIOS, PRIORITY_CHECK}


def test_a_failure_scenario_with_a_generator_and_no_check_is_refused(monkeypatch: pytest.MonkeyPatch):
    """The checks read the scenarios' one list (scenario_layouts.SCENARIOS): a name added there
    and not given its check fails, naming it."""
    import apps.analysis.scenario_checks as checks

    monkeypatch.setattr(checks, "SCENARIOS", (*SCENARIOS, "prefix_storm"))
    with pytest.raises(ImportError, match="prefix_storm"):
        checks._checks_by_name()
