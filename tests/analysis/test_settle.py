"""What would settle an unsettled comparison (apps/analysis/settle.py): table-driven."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from apps.analysis.settle import Design, needed_text

BASE = Design(
    metric="ttft_p99_ms",
    b0=2000.0,
    within_rel=0.10,
    run_sd=0.02,
    rounds=3,
    df=2,
    cells=2,
    alpha=0.05,
    family=4,
    floor_rel=0.05,
    observation_s=120.0,
)

# id, design, change, (found, below material, repeats given, window given), words the clause holds
CASES = [
    ("found", replace(BASE, within_rel=0.05, run_sd=0.001), 0.30, (True, False, False, False), "would be found"),
    ("below the material threshold", BASE, 0.03, (False, True, False, False), "below the material threshold"),
    ("the spread between runs binds", replace(BASE, run_sd=0.3, within_rel=0.01), 0.2, (False, False, True, False),
     "a longer window alone does not"),
    ("the requests bind", replace(BASE, within_rel=0.4, run_sd=0.001), 0.2, (False, False, True, True), "window"),
    ("one repeat", replace(BASE, run_sd=None, rounds=1, df=0), 0.2, (False, False, False, False),
     "run at least 2 to measure it"),
    ("no repeats up to 200", replace(BASE, run_sd=3.0), 0.06, (False, False, False, False), "no number of repeats"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("design", "change", "expected", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_it_says_what_detects_a_change(design, change, expected, words):
    needed = design.to_detect(change)
    found, below, repeats, window = expected
    assert (needed.found, needed.below_material) == (found, below)
    assert (needed.repeats is not None, needed.window_s is not None) == (repeats, window)
    assert words in needed_text(design, needed)
    if needed.repeats is not None:
        # The fewest: that many find it, one fewer does not.
        assert design.detectable_rel(needed.repeats) <= change < design.detectable_rel(needed.repeats - 1)
    if needed.window_s is not None:
        factor = needed.window_s / design.observation_s
        assert design.detectable_rel(window=factor) <= change + 1e-12
        assert design.detectable_rel(window=(needed.window_s - 1) / design.observation_s) > change


def test_its_limit_at_this_design_is_the_largest_of_the_three():
    assert BASE.detectable_rel() == max(BASE.within_rel, BASE.between_rel(), BASE.floor_rel)
    assert replace(BASE, run_sd=None).between_rel() == math.inf
    # More repeats narrow both limits; a longer window only the one within runs.
    assert BASE.detectable_rel(6) < BASE.detectable_rel()
    wide = replace(BASE, run_sd=0.3, within_rel=0.01)
    assert wide.detectable_rel(window=4.0) == wide.detectable_rel()
