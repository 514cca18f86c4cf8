"""A search's pure core (#36): the objective, best k, Pareto front, stopping rule
(apps/search/objective.py) and the optimiser rebuilt from recorded trials (apps/search/study.py)."""

from __future__ import annotations

import math

from apps.search.objective import (
    BROKE,
    FAILED,
    FAILED_SCORE,
    KEPT,
    Trial,
    best_k,
    outcome_of,
    pareto_front,
    pick_confirmed,
    stop_reason,
    worst_margin,
)
from apps.search.study import importances, propose, server_args

SPACE = {
    "max_num_batched_tokens": {"min": 256, "max": 8192, "log": True},
    "max_num_seqs": {"values": [8, 16, 32]},
    "enable_chunked_prefill": {"values": [True, False]},
    "long_prefill_token_threshold": {"values": [128, 512]},
}


def test_the_worst_class_margin_uses_each_class_primary_metric_and_its_limit() -> None:
    contracts = {
        "short": {"ttft_p99_ms": 500.0, "e2e_p99_ms": 9e9, "max_stall_ms": 1.0},
        "long": {"ttft_p99_ms": 1.0, "e2e_p99_ms": 20_000.0, "max_stall_ms": 1.0},
    }
    primaries = {"short": "ttft_p99_ms", "long": "e2e_p99_ms"}
    p99s = {"short": {"ttft_p99_ms": 400.0}, "long": {"e2e_p99_ms": 19_000.0}}
    margin, cls = worst_margin(p99s, contracts, primaries)
    assert (round(margin, 3), cls) == (0.05, "long")
    # Nothing completed in a class: the floor.
    assert worst_margin({"short": {"ttft_p99_ms": 1.0}}, contracts, primaries) == (-1.0, "long")
    assert (outcome_of(0.1), outcome_of(-0.1), outcome_of(None)) == (KEPT, BROKE, FAILED)


def trial(n: int, margin: float | None, tput: float = 1.0, **params: object) -> Trial:
    return Trial(n, params or {"max_num_seqs": n}, outcome_of(margin), margin, tput, engine_s=100.0)


def test_best_k_prefers_margin_then_throughput_and_skips_failed_and_repeated_configs() -> None:
    trials = [
        trial(0, 0.1),
        trial(1, None),
        trial(2, 0.3, 1.0),
        Trial(3, {"max_num_seqs": 3}, KEPT, 0.3, 2.0),
        Trial(4, {"max_num_seqs": 3}, KEPT, 0.3, 9.0),  # the same config as trial 3, measured faster
        trial(5, -0.2),
    ]
    assert [t.number for t in best_k(trials, 3)] == [4, 2, 0]
    assert trials[1].score == FAILED_SCORE
    assert pareto_front(trials) == [4]


def test_the_screening_stops_on_trials_engine_hours_or_patience() -> None:
    trials = [trial(i, 0.1 if i == 0 else 0.05) for i in range(5)]
    assert stop_reason(trials, max_trials=10, max_engine_hours=None, patience=None) is None
    assert "max_trials" in (stop_reason(trials, max_trials=5, max_engine_hours=None, patience=None) or "")
    assert "engine-hours" in (stop_reason(trials, max_trials=10, max_engine_hours=0.1, patience=None) or "")
    assert "4 trials without" in (stop_reason(trials, max_trials=10, max_engine_hours=None, patience=4) or "")


def test_pick_confirmed_takes_the_widest_margin_above_b0s() -> None:
    margins = {"C1": 0.2, "C2": 0.3, "C3": 0.1}
    assert pick_confirmed(["C1", "C2", "C3"], margins, baseline=0.15) == "C2"
    assert pick_confirmed(["C3"], margins, baseline=0.15) is None
    assert pick_confirmed([], margins) is None


def test_server_args_apply_vllms_chunked_prefill_rules() -> None:
    b0 = {"max_num_batched_tokens": 4096, "max_num_seqs": 16, "long_prefill_token_threshold": 64}
    off = server_args(
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 512, "long_prefill_token_threshold": 512},
        baseline_args=b0,
        max_model_len=2048,
    )
    assert off == {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 16,
        "long_prefill_token_threshold": 64,
        "enable_chunked_prefill": False,
    }
    on = server_args(
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 512}, baseline_args=b0, max_model_len=2048
    )
    assert on["max_num_batched_tokens"] == 512


def test_proposals_are_new_valid_configs_rebuilt_from_the_rows_alone() -> None:
    trials: list[Trial] = []
    seen = set()
    for n in range(12):
        params = propose(SPACE, trials, baseline_args={}, max_model_len=2048, seed=3)
        assert params is not None
        args = server_args(params, baseline_args={}, max_model_len=2048)
        key = tuple(sorted(args.items()))
        assert key not in seen
        seen.add(key)
        assert 256 <= args["max_num_batched_tokens"] <= 8192
        if not args["enable_chunked_prefill"]:
            assert args["max_num_batched_tokens"] >= 2048 and "long_prefill_token_threshold" not in args
        margin = -abs(math.log2(args["max_num_batched_tokens"] / 1024)) / 10
        trials.append(Trial(n, params, outcome_of(margin), margin, 1.0, engine_s=100.0))
    # The same rows give the same proposal: the database is the study.
    again = [propose(SPACE, trials, baseline_args={}, max_model_len=2048, seed=3) for _ in range(2)]
    assert again[0] == again[1]
    found = importances(SPACE, trials)
    assert set(found) <= set(SPACE) and max(found, key=lambda k: found[k]) == "max_num_batched_tokens"


def test_a_small_space_is_used_up() -> None:
    space = {"max_num_seqs": {"values": [8, 16]}}
    trials = [Trial(0, {"max_num_seqs": 8}, KEPT, 0.1), Trial(1, {"max_num_seqs": 16}, KEPT, 0.2)]
    assert propose(space, trials, baseline_args={}, max_model_len=None, seed=1) is None
    pending = [{"max_num_seqs": 8}]
    assert propose(space, trials[1:], baseline_args={}, max_model_len=None, seed=1, pending=pending) is None


def test_the_next_step_screens_waits_then_confirms_the_best_k() -> None:
    from apps.search.steps import CONFIRM, SCREEN, WAIT, next_step

    search = {
        "space": SPACE,
        "budget": {"max_trials": 3, "max_engine_hours": None, "patience": None},
        "confirm": 2,
    }
    kw = {"baseline_args": {"max_num_seqs": 8}, "max_model_len": 2048, "seed": 5}
    first = next_step(search, [], **kw)
    assert first.action == SCREEN and first.args == server_args(
        first.params, baseline_args={"max_num_seqs": 8}, max_model_len=2048
    )
    # One host: a trial running means wait.
    assert next_step(search, [], pending=[first.params], **kw).action == WAIT
    trials = [
        Trial(0, {"max_num_seqs": 8}, KEPT, 0.1),
        Trial(1, {"max_num_seqs": 16}, FAILED, None, reason="did not start"),
        Trial(2, {"max_num_seqs": 32}, KEPT, 0.3),
    ]
    done = next_step(search, trials, **kw)
    assert done.action == CONFIRM and "max_trials" in done.why
    assert [(c["id"], c["args"]["max_num_seqs"]) for c in done.cells] == [("T2", 32), ("T0", 8)]
