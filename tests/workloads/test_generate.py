from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apps.workloads.arrivals import coefficient_of_variation
from apps.workloads.generate import (
    GenerateError,
    draw_classes,
    generate_trace,
    trace_from_imported,
    trace_seed,
    uniform_variant,
)
from apps.workloads.importers import read_trace_file, select_window
from apps.workloads.prompts import PromptTokenizer, corpus_sha256
from apps.workloads.tracefile import trace_dumps, trace_loads, trace_sha256
from tests.workloads.conftest import FIXTURES

CLASSES = [
    {"name": "short", "input_tokens": 6, "output_tokens": 4, "priority": 0, "shared_prefix_tokens": 0},
    {"name": "long", "input_tokens": 12, "output_tokens": 2, "priority": 1, "shared_prefix_tokens": 4},
]


def _generate(tokenizer: PromptTokenizer, tokenizer_dir: Path, **overrides: Any):  # type: ignore[no-untyped-def]
    params: dict[str, Any] = {
        "classes": CLASSES,
        "mixture_name": "80-20",
        "mixture": {"short": 0.8, "long": 0.2},
        "rate_name": "low",
        "rate_rps": 5.0,
        "arrival_process": "gamma",
        "arrival_cv": 2.0,
        "seed": 20261129,
        "repeat": 1,
        "warmup_s": 2.0,
        "observation_s": 20.0,
        "tokenizer_dir": tokenizer_dir,
        "tokenizer_revision": "tiny-v1",
        "tokenizer": tokenizer,
    }
    params.update(overrides)
    return generate_trace(**params)


def test_it_gives_the_same_hash_for_the_same_spec_and_seed(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    one = trace_dumps(_generate(tokenizer, tokenizer_dir))
    # A fresh tokenizer load: nothing cached decides the bytes.
    two = trace_dumps(_generate(PromptTokenizer(tokenizer_dir), tokenizer_dir))
    assert trace_sha256(one) == trace_sha256(two)
    others = {
        trace_sha256(trace_dumps(_generate(tokenizer, tokenizer_dir, **change)))
        for change in ({"seed": 1}, {"repeat": 2}, {"rate_name": "high"}, {"mixture_name": "other"})
    }
    assert trace_sha256(one) not in others
    assert len(others) == 4


def test_it_writes_a_valid_trace_with_warmup_flags_and_exact_prompts(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    trace = _generate(tokenizer, tokenizer_dir)
    parsed = trace_loads(trace_dumps(trace))
    assert parsed.meta["corpus_sha256"] == corpus_sha256(parsed.prompts())
    assert parsed.meta["mixture"] == "80-20" and parsed.meta["rate_rps"] == 5.0
    assert parsed.meta["tokenizer_sha256"] == tokenizer.sha256
    for r in parsed.requests:
        assert 0 <= r.t_offset_s < 22.0
        assert r.warmup == (r.t_offset_s < 2.0)
        assert tokenizer.encode(tokenizer.decode(r.prompt_token_ids)) == r.prompt_token_ids
        assert len(r.prompt_token_ids) == r.input_tokens
    assert any(r.warmup for r in parsed.requests) and not all(r.warmup for r in parsed.requests)
    longs = [r.prompt_token_ids for r in parsed.requests if r.klass == "long"]
    assert all(p[:4] == longs[0][:4] for p in longs)
    assert {r.priority for r in parsed.requests if r.klass == "long"} == {1}


def test_it_measures_cv_3_and_the_mixture_over_10000_gamma_requests(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    trace = _generate(
        tokenizer, tokenizer_dir, rate_rps=100.0, arrival_cv=3.0, warmup_s=0.0, observation_s=100.0
    )
    times = np.array([r.t_offset_s for r in trace.requests])
    assert 9_000 <= len(times) <= 11_000
    assert coefficient_of_variation(np.diff(times)) == pytest.approx(3.0, rel=0.10)
    shares = Counter(r.klass for r in trace.requests)
    assert shares["short"] / len(times) == pytest.approx(0.8, abs=0.02)
    assert shares["long"] / len(times) == pytest.approx(0.2, abs=0.02)


def test_it_measures_cv_1_over_10000_poisson_requests(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    trace = _generate(
        tokenizer,
        tokenizer_dir,
        arrival_process="poisson",
        arrival_cv=None,
        rate_rps=100.0,
        warmup_s=0.0,
        observation_s=100.0,
        mixture_name="50-50",
        mixture={"short": 0.5, "long": 0.5},
    )
    times = np.array([r.t_offset_s for r in trace.requests])
    assert 9_500 <= len(times) <= 10_500
    assert coefficient_of_variation(np.diff(times)) == pytest.approx(1.0, rel=0.10)
    assert Counter(r.klass for r in trace.requests)["short"] / len(times) == pytest.approx(0.5, abs=0.02)


def test_it_draws_classes_by_exact_count_quotas() -> None:
    labels = draw_classes(
        weights={"a": 0.5, "b": 0.3, "c": 0.2, "z": 0.0}, count=7, rng=np.random.default_rng(1)
    )
    assert Counter(labels) == {"a": 4, "b": 2, "c": 1}
    ordered = draw_classes(weights={"a": 0.5, "b": 0.5}, count=1000, rng=np.random.default_rng(2))
    assert ordered[:10] != ["a"] * 10  # shuffled, not blocked


def test_it_builds_the_uniform_companion_from_the_same_requests(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    bursty = _generate(tokenizer, tokenizer_dir, arrival_cv=3.0)
    even = _generate(tokenizer, tokenizer_dir, arrival_cv=3.0, uniform=True)
    assert trace_dumps(even) == trace_dumps(uniform_variant(bursty))
    assert even.meta["corpus_sha256"] == bursty.meta["corpus_sha256"]
    assert [r.klass for r in even.requests] == [r.klass for r in bursty.requests]
    assert [r.prompt_token_ids for r in even.requests] == [r.prompt_token_ids for r in bursty.requests]
    gaps = np.diff([r.t_offset_s for r in even.requests])
    assert np.allclose(gaps, 22.0 / len(even.requests), atol=2e-6)
    assert even.meta["kind"] == "uniform" and even.meta["bursty_arrival"] == {"process": "gamma", "cv": 3.0}
    trace_loads(trace_dumps(even))


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"mixture": {"tiny": 1.0}}, "unknown class 'tiny'"),
        ({"mixture": {"short": 0.0}}, "positive weight"),
        ({"rate_rps": -1.0}, "rate_rps"),
        ({"arrival_cv": None}, "cv"),
        ({"observation_s": 0.0}, "observation_s"),
        ({"rate_rps": 0.001, "observation_s": 1.0, "warmup_s": 0.0}, "gives no request"),
    ],
)
def test_it_refuses_bad_parameters(tokenizer, tokenizer_dir, override, fragment) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GenerateError, match=fragment):
        _generate(tokenizer, tokenizer_dir, **override)


def test_it_derives_trace_seeds_from_names() -> None:
    base = trace_seed(experiment_seed=1, mixture="m", rate_name="r", repeat=1)
    assert base == trace_seed(experiment_seed=1, mixture="m", rate_name="r", repeat=1)
    assert base != trace_seed(experiment_seed=1, mixture="m", rate_name="r", repeat=2)


def test_it_turns_an_imported_window_into_a_canonical_trace(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    imported = read_trace_file(FIXTURES / "burstgpt_v1.csv", fmt="burstgpt")
    trace = trace_from_imported(
        imported=imported,
        thresholds=[("short", 1000), ("long", None)],
        priorities={"long": 2},
        tokenizer_dir=tokenizer_dir,
        tokenizer_revision="tiny-v1",
        seed=3,
        tokenizer=tokenizer,
    )
    parsed = trace_loads(trace_dumps(trace))
    assert [r.klass for r in parsed.requests] == ["short", "short", "long"]
    assert [r.priority for r in parsed.requests] == [0, 0, 2]
    assert [r.t_offset_s for r in parsed.requests] == [0.0, 113.0, 113.0]
    assert parsed.meta["failed_dropped"] == 1
    for r in parsed.requests:
        assert tokenizer.encode(tokenizer.decode(r.prompt_token_ids)) == r.prompt_token_ids


def test_it_shares_prompt_blocks_where_imported_hash_ids_match(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    imported = read_trace_file(FIXTURES / "vllm_timed.jsonl", fmt="vllm-timed")
    window = select_window(imported, start_s=0.0, length_s=10.0)
    trace = trace_from_imported(
        imported=window,
        thresholds=[("all", None)],
        tokenizer_dir=tokenizer_dir,
        tokenizer_revision="tiny-v1",
        seed=3,
        warmup_s=0.1,
        tokenizer=tokenizer,
    )
    a, b, c = (r.prompt_token_ids for r in trace.requests)
    assert [len(a), len(b), len(c)] == [40, 36, 20]
    assert a[:32] == b[:32] and a[32:] != b[32:36]
    assert trace.requests[0].hash_ids == [1, 2, 3] and trace.requests[2].hash_ids is None
    assert [r.warmup for r in trace.requests] == [True, False, False]
    assert trace.meta["observation_s"] == pytest.approx(9.9)
    trace_loads(trace_dumps(trace))


def test_it_observes_an_unwindowed_import_up_to_its_last_arrival(tokenizer, tokenizer_dir) -> None:  # type: ignore[no-untyped-def]
    imported = read_trace_file(FIXTURES / "azure_2024.csv", fmt="azure")
    params = {
        "imported": imported,
        "thresholds": [("all", None)],
        "tokenizer_dir": tokenizer_dir,
        "tokenizer_revision": "tiny-v1",
        "seed": 1,
        "tokenizer": tokenizer,
    }
    trace = trace_from_imported(**params, warmup_s=0.001)
    last = trace.requests[-1].t_offset_s
    assert last < trace.meta["warmup_s"] + trace.meta["observation_s"]
    assert [r.warmup for r in trace.requests] == [True, False, False]
    with pytest.raises(GenerateError, match="no observation window"):
        trace_from_imported(**params, warmup_s=5.0)
