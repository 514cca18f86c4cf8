"""The verdict's statistical rules (docs/ANALYSIS.md, "How much the verdict can be trusted")."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from apps.analysis import inference
from apps.analysis.compare import Rows, judge
from apps.analysis.compare_options import CompareOptions
from apps.analysis.family import primary_metrics
from apps.analysis.resample import Resampling
from tests.analysis.builders import Plan, build
from tests.analysis.synthetic import Design, result_set, verdict


def test_it_needs_order_statistics_worth_of_requests_before_judging_a_quantile():
    assert inference.judgeable_n(0.99) == 299
    assert inference.judgeable_n(0.95) == 59
    assert inference.judged_level(298) == "p95"
    assert inference.judged_level(299) == "p99"
    assert inference.judged_level(58) is None


def test_it_calls_288_long_requests_not_enough_to_judge_p99_and_falls_back_to_p95():
    # 3 repeats x 480 requests at 80/20: 96 long requests per run, 288 pooled.
    from apps.analysis.report import build_report

    report = build_report(**result_set(Design(), 1), token_hists={}, chunk_hists={})
    long = [c for c in report["comparisons"] if c["class"] == "long"]
    assert long and all(sum(c["requests"]) == 288 for c in long)
    for c in long:
        p99 = c["metrics"]["e2e_p99_ms"]
        assert p99["judged"] is False
        assert p99["note"] == "not enough requests to judge long e2e p99 (n=288 < 299)"
        assert p99["direction"] == "same"
        assert c["primary"] == "e2e_p95_ms" and c["metrics"]["e2e_p95_ms"]["judged"] is True
    assert "not enough requests to judge long e2e p99 (n=288 < 299)" in report["statistics"]["notes"]
    short = next(c for c in report["comparisons"] if c["class"] == "short")
    assert short["primary"] == "ttft_p99_ms" and short["metrics"]["ttft_p99_ms"]["judged"] is True


def slow_tokens_c1(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    return {"itl_ms": 40.0} if cell == "C1" else {}


def test_it_never_calls_inter_token_latency_material_with_three_repeats():
    report = build(Plan(repeats=3), slow_tokens_c1)
    itl = [c["metrics"]["itl_p99_ms"] for c in report["comparisons"] if c["cell"] == "C1"]
    assert itl and all(v["direction"] == "same" and v["judged"] is False for v in itl)
    assert all("never called material" in v["note"] for v in itl)
    # The same fourfold slowdown with five repeats is called what it is.
    five = build(Plan(repeats=5, per_class=40), slow_tokens_c1)
    itl5 = [c["metrics"]["itl_p99_ms"] for c in five["comparisons"] if c["cell"] == "C1"]
    assert itl5 and all(v["direction"] == "worse" for v in itl5)


def _over_limit_count(n: int) -> int:
    """The fewest of n requests over a p99 limit that the binomial test calls broken."""
    return next(k for k in range(1, n) if inference.share_breaks(k, n, 0.01, 0.05)[0])


def test_it_gives_no_retune_when_b0_breaks_a_contract_and_the_candidate_is_no_better():
    plan = replace(Plan(), per_class=200, mixtures={"mix": {"short": 1.0}})
    n = plan.per_class * plan.repeats
    k = _over_limit_count(n)
    slow = {"B0": k, "C1": k - 1, "C2": k + 5}

    def behaviour(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
        # Requests spread over the repeats: the first slow[cell] of the pooled cohort exceed 500 ms.
        pooled = rep * plan.per_class + (idx - 2)
        return {"ttft_ms": 600.0 if pooled < slow[cell] else 100.0 + (idx % 7)}

    report = build(plan, behaviour)
    acc = report["checks"]["acceptance"]["cells"]
    assert not acc["B0"]["passed"] and acc["B0"]["failures"][0]["broken"] == ["ttft"]
    assert acc["C1"]["passed"], "one request fewer over the limit is not a broken contract"
    c1 = next(c for c in report["decision"]["evidence"]["candidates"] if c["cell"] == "C1")
    assert "not materially better on what B0 broke" in c1["reasons"]
    assert report["decision"]["outcome"] != "retune"


def _rows(hi: list[float], lo: list[float] | None = None) -> Rows:
    h = np.asarray(hi, dtype=float)
    return Rows(hi=h, lo=np.asarray(lo if lo is not None else hi, dtype=float))


def test_it_calls_a_candidate_above_a_censored_b0s_lower_bound_the_same():
    # B0 never observed (its p99 is only known to be above 1,000 ms); the candidate is at 1,500 ms.
    draws = 2000
    base = _rows([np.inf] * (1 + 3 + draws), [1000.0] * (1 + 3 + draws))
    cand = _rows([1500.0] * (1 + 3 + draws))
    fit = inference.rounds_fit({"B0": [1000.0] * 3, "C1": [1500.0] * 3})  # B0's bounds stand in
    v = judge("e2e_p99_ms", cand, base, n_rep=3, options=CompareOptions(), fit=fit)
    assert v["direction"] == "same" and not v["worse"]
    assert v["p_better"] == 1.0, "a candidate above B0's lower bound is no evidence of a gain"
    assert v["b0_censored"] and v["b0_above"] == 1000.0
    # And one observed below B0's bound is a gain worth testing.
    below = judge(
        "e2e_p99_ms", _rows([800.0] * (1 + 3 + draws)), base, n_rep=3, options=CompareOptions(), fit=fit
    )
    assert below["p_better"] < 0.001 and below["improvement"] == 200.0


def test_it_lets_draws_where_both_sides_are_censored_support_neither_claim():
    draws = 2000
    both = _rows([np.inf] * (1 + 3 + draws), [1000.0] * (1 + 3 + draws))
    v = judge("e2e_p99_ms", both, both, n_rep=3, options=CompareOptions())
    assert v["p_better"] == 1.0 and v["p_worse"] == 1.0
    assert v["direction"] == "same" and v["ci_unbounded"] == [True, True]


def test_it_adjusts_the_family_with_holm():
    adjusted, rejected = inference.holm([0.01, 0.04, 0.03, 0.005], 0.05)
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rejected == [True, False, False, True]


def test_it_breaks_a_p99_limit_only_when_the_share_over_it_is_above_one_percent_with_confidence():
    assert inference.share_breaks(3, 288, 0.01, 0.05) == (False, pytest.approx(0.5504, abs=1e-4))
    assert inference.share_breaks(8, 288, 0.01, 0.05)[0] is True
    assert inference.share_breaks(1, 100, 0.0, 0.05) == (True, 0.0)
    assert inference.share_breaks(0, 0, 0.01, 0.05) == (False, 1.0)


def test_it_draws_whole_runs_of_consecutive_requests():
    rs = Resampling([100, 50], 40, [7, 1])
    assert rs.blocks == [10, 8]
    fixed = rs.fixed()
    assert fixed[0].sum() == 150 and fixed[1, :100].all() and not fixed[1, 100:].any()
    for counts, mult in rs.chunks():
        np.testing.assert_array_equal(counts[:, :100].sum(axis=1), mult[:, 0] * 100)
        np.testing.assert_array_equal(counts[:, 100:].sum(axis=1), mult[:, 1] * 50)
    first = next(Resampling([100, 50], 40, [7, 1]).chunks())[0]
    np.testing.assert_array_equal(first, next(Resampling([100, 50], 40, [7, 1]).chunks())[0])


def test_it_defaults_the_primary_metric_by_role_and_takes_a_declared_one():
    classes = [
        {"name": "chat", "input_tokens": 256},
        {"name": "doc", "input_tokens": 8000},
        {"name": "mid", "input_tokens": 2000, "primary_metric": "max_stall_p99_ms"},
    ]
    assert primary_metrics(classes) == {
        "chat": "ttft_p99_ms",
        "doc": "e2e_p99_ms",
        "mid": "max_stall_p99_ms",
    }
    with pytest.raises(ValueError, match="primary_metric"):
        primary_metrics([{"name": "x", "input_tokens": 1, "primary_metric": "goodput"}])


def test_it_reaches_the_same_a_a_verdict_under_every_seed_at_2000_draws():
    design = Design(requests=240)
    for fixture in range(8):
        outcomes = {
            (v["outcome"], v["chosen_cell"])
            for seed in (0, 11, 29)
            for v in [verdict(design, fixture, options={"compare": {"seed": seed, "resamples": 2000}})]
        }
        assert len(outcomes) == 1, f"A/A fixture {fixture} flips with the seed: {outcomes}"


def test_it_states_the_power_of_the_design_per_class():
    from apps.analysis.report import build_report

    report = build_report(**result_set(Design(), 2), token_hists={}, chunk_hists={})
    power = {p["class"]: p for p in report["statistics"]["power"]}
    assert power["long"]["metric"] == "e2e_p95_ms" and power["short"]["metric"] == "ttft_p99_ms"
    for p in power.values():
        assert p["power"] == 0.8 and p["family"] == report["statistics"]["family"]["planned_size"] == 6
        assert 0.05 <= p["detectable_rel"] < 1.0


def _planned_80_20(rate_rps: float) -> dict[str, inference.PlannedPoint]:
    """The planned power of an 80/20 mixture, 3 repeats of 60 s, three candidates, by class."""
    points = inference.planned_power(
        classes=[{"name": "short"}, {"name": "long"}],
        mixtures={"80-20": {"short": 0.8, "long": 0.2}},
        rates={"r": rate_rps},
        repeats=3,
        observation_s=60.0,
        candidates=3,
        alpha=0.05,
        primary={"short": "ttft_p99_ms", "long": "e2e_p99_ms"},
    )
    return {p.cls: p for p in points}


def test_it_estimates_the_power_before_the_plan_starts():
    by = _planned_80_20(8.0)
    assert by["short"].requests == 1152 and by["short"].level == "p99"
    assert by["long"].requests == 288 and by["long"].level == "p95"
    assert by["long"].metric == "e2e_p95_ms"
    # Ten times the requests: about a third of the detectable change.
    short10 = _planned_80_20(80.0)["short"]
    assert short10.detectable_rel == pytest.approx(by["short"].detectable_rel / 10**0.5, rel=1e-6)


def _runs_with_slow_hosts(rng: np.random.Generator, *, repeats: int, effect: float = 1.0) -> list[float]:
    """Each run's p99 of 60 requests, the whole run scaled by how busy its host was (log-normal)."""
    out = []
    for _ in range(repeats):
        host = float(np.exp(rng.normal(0.0, 0.25)))
        out.append(float(np.quantile(rng.exponential(400.0, 60), 0.99)) * host * effect)
    return out


def test_it_weighs_a_slow_run_against_the_spread_between_repeats():
    rng = np.random.default_rng(7)
    trials = 4000
    false = sum(
        inference.repeats_p_worse(
            _runs_with_slow_hosts(rng, repeats=2), _runs_with_slow_hosts(rng, repeats=2)
        )
        <= 0.05
        for _ in range(trials)
    )
    # Identical configs, whole runs slower or faster by chance: about 5%, never far above.
    assert false / trials <= 0.065, false / trials
    # A candidate five times slower in the tail is found under the same noise (bench/results/gate_power.md
    # states the power at each size and number of repeats).
    found = sum(
        inference.repeats_p_worse(
            _runs_with_slow_hosts(rng, repeats=2, effect=5.0), _runs_with_slow_hosts(rng, repeats=2)
        )
        <= 0.05
        for _ in range(500)
    )
    assert found / 500 >= 0.85, found / 500


def test_it_judges_the_repeats_on_their_own_values_and_refuses_what_they_cannot_show():
    # Two slow candidate runs inside the spread of B0's own repeats: no evidence.
    assert inference.repeats_p_worse([1900.0, 1950.0], [1500.0, 2100.0]) > 0.2
    # Consistently three times slower: strong evidence, on the log scale.
    assert inference.repeats_p_worse([6000.0, 6400.0], [1500.0, 1600.0]) < 0.01
    # Higher is better (goodput): less is worse.
    assert inference.repeats_p_worse([1.0, 1.1], [3.0, 3.1], higher_is_better=True) < 0.01
    assert inference.repeats_p_worse([3.0, 3.1], [1.0, 1.1], higher_is_better=True) > 0.99
    # Zeros (an error rate): the plain scale.
    assert inference.repeats_p_worse([0.0, 0.0], [0.0, 0.0]) == 1.0
    assert inference.repeats_p_worse([0.1, 0.1], [0.0, 0.0]) == 0.0
    # One repeat a side has no spread; a censored B0 repeat supports no claim.
    assert inference.repeats_p_worse([5000.0], [100.0]) is None
    assert inference.repeats_p_worse([5000.0, 5000.0], [100.0, float("inf")]) == 1.0
    assert inference.repeats_p_worse([5000.0, float("nan")], [100.0, 100.0]) is None


def test_it_reports_the_repeats_worse_test_beside_the_bootstrap():
    rows = Rows(hi=np.array([1.0, 1.0, 1.0]), lo=np.array([1.0, 1.0, 1.0]))
    cand = Rows(hi=np.array([3.0, 3.0, 3.1]), lo=np.array([3.0, 3.0, 3.1]))
    out = judge("ttft_p99_ms", cand, rows, n_rep=2, options=CompareOptions())
    assert out["p_worse_repeats"] is not None and out["p_worse_repeats"] < 0.01


# The run-level model (inference.rounds_fit and what reads it). A 2 x 3 table worked by hand: on
# the log scale A = [0, 1, 2] and B = [1, 1, 4]. Cell means 1 and 2, round means 0.5, 1 and 3,
# grand mean 1.5; the residuals are A [0, 0.5, -0.5] and B [0, -0.5, 0.5], so the residual sum of
# squares is 1 over (2 - 1) x (3 - 1) = 2 degrees of freedom: sd = sqrt(1/2).
LOG_A = [0.0, 1.0, 2.0]
LOG_B = [1.0, 1.0, 4.0]
RUNS_A = np.exp(LOG_A)
RUNS_B = np.exp(LOG_B)


def _t2_cdf(t: float) -> float:
    """Student's t with 2 degrees of freedom has a closed form: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * (2 + t * t) ** 0.5)


def _t2_ppf(p: float) -> float:
    return (2 * p - 1) / (2 * p * (1 - p)) ** 0.5


def test_it_fits_cells_and_rounds_and_pools_the_run_noise():
    fit = inference.rounds_fit({"A": RUNS_A, "B": RUNS_B})
    assert fit is not None
    assert (fit.scale, fit.rounds, fit.cells, fit.df) == ("log", 3, ("A", "B"), 2)
    assert fit.sd == pytest.approx(0.5**0.5)
    # A round shared by every cell is the round effect: it leaves the fit unchanged.
    shifted = inference.rounds_fit({"A": RUNS_A * [1.0, 3.0, 0.5], "B": RUNS_B * [1.0, 3.0, 0.5]})
    assert shifted is not None and shifted.sd == pytest.approx(fit.sd)
    # A zero puts the fit on the plain scale: the same table read as plain values.
    plain = inference.rounds_fit({"A": LOG_A, "B": LOG_B})
    assert plain is not None and plain.scale == "plain" and plain.sd == pytest.approx(0.5**0.5)


def test_it_leaves_censored_and_missing_rounds_out_of_the_fit():
    with_censored = inference.rounds_fit({"A": RUNS_A, "B": RUNS_B, "C": [1.0, np.inf, 2.0]})
    assert with_censored is not None and with_censored.cells == ("A", "B") and with_censored.df == 2
    assert inference.rounds_fit({"A": RUNS_A, "B": RUNS_B, "C": [1.0, np.nan, 2.0]}).cells == ("A", "B")
    # One complete cell, or one round: no spread between runs to estimate.
    assert inference.rounds_fit({"A": RUNS_A, "B": [1.0, np.inf, 2.0]}) is None
    assert inference.rounds_fit({"A": [1.0], "B": [2.0]}) is None
    assert inference.rounds_fit({"A": RUNS_A, "B": RUNS_B[:2]}) is None


def test_it_compares_a_candidate_with_b0_round_by_round():
    fit = inference.rounds_fit({"A": RUNS_A, "B": RUNS_B})
    assert fit is not None
    # B - A per round: [1, 0, 2], mean 1; its own sd (variance 1, over 2) equals the pool's, so
    # SE = sqrt(2 x 1/2 / 3) = 1/sqrt(3) and t = sqrt(3) on 2 degrees of freedom.
    out = inference.rounds_compare(fit, RUNS_B, RUNS_A, higher_is_better=False, confidence=0.95)
    assert out is not None
    assert out.diff == pytest.approx(1.0) and out.se == pytest.approx(3**-0.5) and out.df == 2
    assert out.p_worse == pytest.approx(1 - _t2_cdf(3**0.5))  # 0.1127
    assert out.p_better == pytest.approx(_t2_cdf(3**0.5))
    half = _t2_ppf(0.975) * 3**-0.5  # 4.3027 x 0.5774
    assert out.ci == pytest.approx((1.0 - half, 1.0 + half))
    # Higher is better (goodput): the same difference is a gain.
    up = inference.rounds_compare(fit, RUNS_B, RUNS_A, higher_is_better=True, confidence=0.95)
    assert up is not None and up.p_better == pytest.approx(out.p_worse)


def test_it_judges_a_pair_noisier_than_the_pool_by_its_own_spread():
    calm = inference.RoundsFit(scale="log", rounds=3, cells=("A", "B"), df=2, sd=0.1)
    out = inference.rounds_compare(calm, RUNS_B, RUNS_A, higher_is_better=False, confidence=0.95)
    assert (
        out is not None
        and out.sd == pytest.approx(0.5**0.5)
        and out.p_worse == pytest.approx(0.1127, abs=1e-4)
    )
    # No spread anywhere (a pool and a pair that never vary): the sign of the difference decides.
    still = inference.RoundsFit(scale="log", rounds=3, cells=("A", "B"), df=2, sd=0.0)
    same = inference.rounds_compare(
        still, [2.0, 2.0, 2.0], [1.0, 1.0, 1.0], higher_is_better=False, confidence=0.95
    )
    assert same is not None and (same.p_worse, same.p_better) == (0.0, 1.0)


def test_it_lets_an_unbounded_run_support_no_claim_and_refuses_what_does_not_fit():
    fit = inference.rounds_fit({"A": RUNS_A, "B": RUNS_B})
    assert fit is not None
    out = inference.rounds_compare(fit, [1.0, np.inf, 2.0], RUNS_A, higher_is_better=False, confidence=0.95)
    assert out is not None and (out.p_better, out.p_worse) == (1.0, 1.0)
    assert out.ci == (-np.inf, np.inf)
    assert (
        inference.rounds_compare(fit, RUNS_B[:2], RUNS_A[:2], higher_is_better=False, confidence=0.95) is None
    )
    assert (
        inference.rounds_compare(fit, [0.0, 1.0, 2.0], RUNS_A, higher_is_better=False, confidence=0.95)
        is None
    )
    assert (
        inference.rounds_compare(fit, [np.nan, 1.0, 2.0], RUNS_A, higher_is_better=False, confidence=0.95)
        is None
    )


def test_it_measures_the_spread_between_whole_runs():
    assert inference.run_spread(RUNS_A) == pytest.approx(1.0)  # SD of [0, 1, 2]
    # Unbounded, zero and unknown values are no run's value; one repeat has no spread.
    assert inference.run_spread([1.0, np.inf, 0.0, np.e, np.nan]) == pytest.approx(0.5**0.5)
    assert inference.run_spread([5.0]) is None
    assert inference.run_spread([5.0, np.inf]) is None
    # An A/A pair: the SD of the per-round log differences [1, 0, 2] over sqrt(2).
    assert inference.pair_spread(RUNS_B, RUNS_A) == pytest.approx(0.5**0.5)
    assert inference.pair_spread([2.0, np.inf, 3.0], [1.0, 1.0, np.nan]) is None


def test_it_states_the_smallest_change_the_run_level_test_finds():
    # (t(0.95, 2) + t(0.8, 2)) x sqrt(2 x 0.5^2 / 3) = (2.9200 + 1.0607) x 0.4082 = 1.6251.
    crit = _t2_ppf(0.95) + _t2_ppf(0.8)
    got = inference.rounds_detectable(0.5, rounds=3, df=2, alpha=0.05, family=1)
    assert got == pytest.approx(crit * (2 * 0.25 / 3) ** 0.5)
    assert got == pytest.approx(1.6251, abs=1e-4)
    assert inference.rounds_detectable(0.5, rounds=1, df=2, alpha=0.05, family=1) == np.inf
    assert inference.rounds_detectable(0.5, rounds=3, df=0, alpha=0.05, family=1) == np.inf
    assert inference.rounds_detectable(np.inf, rounds=3, df=2, alpha=0.05, family=1) == np.inf
    # A larger family asks for a stricter level: a larger change.
    assert inference.rounds_detectable(0.5, rounds=3, df=2, alpha=0.05, family=6) > got


def test_it_counts_the_repeats_a_change_needs():
    # A 40% change is |ln 0.6| = 0.511 on the log scale. Runs spread by 0.1, two cells: two rounds
    # (df 1) reach (t(0.95, 1) + t(0.8, 1)) x 0.1 = (6.314 + 1.376) x 0.1 = 0.769, too little;
    # three rounds (df 2) reach 3.981 x 0.0816 = 0.325.
    assert inference.repeats_needed(0.1, 0.4, cells=2, alpha=0.05, family=1) == 3
    # Runs spread by 0.25, four cells, a family of six (alpha 0.05 / 6): six rounds (df 15) reach
    # (t(0.99167, 15) + t(0.8, 15)) x 0.25 x sqrt(2/6) = (2.694 + 0.866) x 0.1443 = 0.514, just short
    # of 0.511; seven (df 18) reach (2.639 + 0.862) x 0.1336 = 0.468.
    assert inference.repeats_needed(0.25, 0.4, cells=4, alpha=0.05, family=6) == 7
    assert inference.rounds_detectable(0.25, rounds=6, df=15, alpha=0.05, family=6) == pytest.approx(
        0.5138, abs=1e-4
    )
    # Unknown spread, a change outside (0, 1), or more than 200 rounds: no number.
    assert inference.repeats_needed(np.inf, 0.4, cells=4, alpha=0.05, family=6) is None
    assert inference.repeats_needed(0.25, 0.0, cells=4, alpha=0.05, family=6) is None
    assert inference.repeats_needed(0.25, 1.0, cells=4, alpha=0.05, family=6) is None
    assert inference.repeats_needed(5.0, 0.4, cells=4, alpha=0.05, family=6) is None


def test_the_t_shortcuts_give_scipy_s_very_values():
    """inference.t_sf / t_cdf / t_ppf skip scipy.stats' per-call argument handling; the values
    must be the same floats, edge cases included (those go to scipy.stats itself)."""
    from scipy.stats import t as student_t

    from apps.analysis import inference

    xs = [
        -1e6,
        -37.5,
        -3.2,
        -1.0,
        -1e-12,
        -0.0,
        0.0,
        1e-300,
        0.7,
        2.0,
        8.0,
        1e9,
        math.inf,
        -math.inf,
        math.nan,
    ]
    qs = [0.0, 1e-12, 0.025, 0.5, 0.8, 0.975, 0.99999, 1.0, -0.1, 1.5, math.nan]
    dfs = [0.5, 1, 2, 3.7, 4, 10, 58, 1e6, math.inf, 0, -1, math.nan]
    for df in dfs:
        for x in xs:
            for mine, theirs in ((inference.t_sf, student_t.sf), (inference.t_cdf, student_t.cdf)):
                a, b = mine(x, df), float(theirs(x, df))
                assert a == b or (math.isnan(a) and math.isnan(b)), (mine.__name__, x, df, a, b)
        for q in qs:
            a, b = inference.t_ppf(q, df), float(student_t.ppf(q, df))
            assert a == b or (math.isnan(a) and math.isnan(b)), ("t_ppf", q, df, a, b)
            assert math.copysign(1, a) == math.copysign(1, b) or math.isnan(a)
