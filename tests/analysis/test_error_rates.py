"""The verdict's error rates at a small size: the figures of bench/analysis/aa_power.py, bounded with margin.

The bench (400 sets each) records false retunes between identical configs at
0-3.5%, whole runs 10-50% apart included, and the power to find a 40% better
long class at 88%. Here fewer sets, so each bound leaves room for chance: even
at a true false-retune rate of 5% (the most the issue allows), 6 or more of 40
happens 1.4% of the time and 5 or more of 30 1.6%; at the 1% these scenarios
measure they are 3 in a million. Even at a true power of 80% (the target),
fewer than 11 of 20 happens 0.3% of the time.
"""

from __future__ import annotations

from apps.analysis.report import build_report
from tests.analysis.synthetic import Design, false_retune, found, result_set, verdict


def test_it_retunes_between_identical_configs_rarely():
    independent = [verdict(Design(requests=240), seed) for seed in range(20)]
    correlated = [verdict(Design(requests=240, phi=0.9), 1000 + seed) for seed in range(20)]
    assert false_retune(independent + correlated) <= 5


def test_it_retunes_rarely_when_b0_sits_at_its_limit():
    near = [verdict(Design(requests=240, near_limit=True), 2000 + seed) for seed in range(30)]
    assert false_retune(near) <= 4


def test_it_finds_a_long_class_forty_percent_faster():
    sets = [verdict(Design(long_factor={"C1": 0.6}), 3000 + seed) for seed in range(20)]
    assert found(sets, "C1") >= 11
    assert sum(1 for s in sets if s["outcome"] == "retune" and s["chosen_cell"] != "C1") <= 1


def _aa(design: Design, seed: int) -> tuple[str, bool]:
    """(the outcome, whether any candidate was called materially worse than B0) of one set."""
    report = build_report(**result_set(design, seed), token_hists={}, chunk_hists={})
    decision = report["decision"]
    candidates = decision["evidence"].get("candidates") or []
    return decision["outcome"], any(c["material_worse"] for c in candidates)


def test_it_retunes_rarely_when_whole_runs_differ():
    """Whole runs 28% faster or slower (a log-normal factor of sigma 0.25 per run), or whole rounds
    (the same factor shared by the cells of a round): the run-level test keeps false retunes at
    the bench's 3.2% and 0.25% (issue 32: 17.5% before it). 8 or more of 60 happens 1% of the
    time even at a true rate of 5%.

    The harm guard tests every metric of every candidate uncorrected, so it errs more often:
    the bench measures 5.5% and 0.5% of A/A sets with some metric called materially worse. 12
    or more of 60 happens 1.5% of the time at a true rate of 10%.
    """
    sets = [_aa(Design(requests=240, host_sigma=0.25), 4000 + seed) for seed in range(30)]
    sets += [_aa(Design(requests=240, round_sigma=0.25), 5000 + seed) for seed in range(30)]
    assert sum(1 for outcome, _ in sets if outcome == "retune") <= 7
    assert sum(1 for _, harmed in sets if harmed) <= 11
