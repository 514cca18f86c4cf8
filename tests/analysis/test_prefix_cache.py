"""The prefix cache's hit rate beside the latency, and whether a gain is the cache's or the
scheduler's (apps/analysis/prefix_cache.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from apps.analysis.prefix_cache import cell_enabled
from tests.analysis.builders import Plan, build
from tests.analysis.test_decision_table import slow_short_b0


def counter(name: str, value: float, t_ns: int, phase: str) -> dict[str, Any]:
    return {
        "t_ns": t_ns,
        "phase": phase,
        "epoch": 0,
        "name": name,
        "labels": {"model_name": "m", "engine": "0"},
        "kind": "counter",
        "value": value,
        "histogram": None,
    }


def cache_counters(hit_rates: dict[str, float]) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """Each run looks up 10,000 prompt tokens and finds its cell's share of them."""

    def samples(run: dict[str, Any]) -> list[dict[str, Any]]:
        hits = 10_000 * hit_rates[run["cell"]]
        return [
            counter("vllm:prefix_cache_queries_total", 500.0, 0, "before"),
            counter("vllm:prefix_cache_hits_total", 100.0, 0, "before"),
            counter("vllm:prefix_cache_queries_total", 10_500.0, 12 * 10**9, "after"),
            counter("vllm:prefix_cache_hits_total", 100.0 + hits, 12 * 10**9, "after"),
        ]

    return samples


def caching_on(run: dict[str, Any]) -> None:
    run["effective_args"] = {"enable_prefix_caching": True, "max_num_seqs": 64}


PLAN = replace(Plan(), mixtures={"mix": {"short": 0.5, "long": 0.5}, "short-only": {"short": 1.0}})


@pytest.mark.parametrize(
    ("rates", "source"),
    [({"B0": 0.2, "C1": 0.6, "C2": 0.2}, "cache"), ({"B0": 0.4, "C1": 0.42, "C2": 0.4}, "scheduler")],
    ids=["candidate-hits-more", "alike"],
)
def test_it_reports_the_hit_rate_and_whether_a_gain_is_the_caches(rates, source) -> None:
    report = build(PLAN, slow_short_b0, samples=cache_counters(rates), run_overrides=caching_on)
    cache = report["prefix_cache"]
    assert cache["enabled"] is True
    assert {c["cell"]: c["from"] for c in cache["cells"]}["C1"] == "the engine's effective arguments"
    rows = {(r["cell"], r["mixture"]): r for r in cache["rows"]}
    assert rows[("C1", "mix")]["hit_rate"] == pytest.approx(rates["C1"])
    # Two classes shared the server: the rate is the run's; alone, it is the short class's.
    assert (rows[("C1", "mix")]["per"], rows[("C1", "mix")]["class"]) == ("run", None)
    assert "shared by short, long" in rows[("C1", "mix")]["note"]
    assert (rows[("C1", "short-only")]["per"], rows[("C1", "short-only")]["class"]) == ("class", "short")
    # Beside the latency it sits by.
    assert {c["class"] for c in rows[("B0", "mix")]["classes"]} == {"short", "long"}
    gains = [g for g in cache["gains"] if g["cell"] == "C1" and g["class"] == "short"]
    assert gains, cache["gains"]
    assert {g["source"] for g in gains} == {source}
    assert all(g["b0_hit_rate"] == pytest.approx(rates["B0"]) for g in gains)


def test_without_prefix_caching_it_says_so_and_attributes_nothing() -> None:
    report = build(PLAN, slow_short_b0, samples=cache_counters({"B0": 0.0, "C1": 0.0, "C2": 0.0}))
    cache = report["prefix_cache"]
    assert cache["enabled"] is False and cache["rows"] == [] and cache["gains"] == []


@pytest.mark.parametrize(
    ("args", "experiment", "expected"),
    [
        ({"enable_prefix_caching": True}, {}, (True, "the engine's effective arguments")),
        (
            {"enable_prefix_caching": "False"},
            {"enable_prefix_caching": True},
            (False, "the engine's effective arguments"),
        ),
        ({}, {"enable_prefix_caching": True}, (True, "the experiment's controls")),
        (None, {}, (None, "unknown")),
    ],
)
def test_a_cell_is_on_by_what_its_engine_confirmed_else_the_controls(args, experiment, expected) -> None:
    runs: list[Any] = [{"cell": "B0", "effective_args": args}]
    assert cell_enabled("B0", runs, experiment) == expected
