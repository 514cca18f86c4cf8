from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.analysis.compare import _quantile_full, resampling, weighted_quantile


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(0, 1e4), st.just(float("inf"))), min_size=1, max_size=400),
    seed=st.integers(0, 2**31),
    q=st.sampled_from([0.5, 0.95, 0.99]),
)
def test_it_gets_the_same_quantile_from_the_tail_as_from_all_values(values, seed, q):
    v = np.asarray(values)
    rs = resampling([v.size], resamples=30, rng=np.random.default_rng(seed))
    order = np.argsort(v, kind="stable")
    full = _quantile_full(v[order], rs.counts[:, order], q)
    fast = weighted_quantile(v, rs, q)
    np.testing.assert_array_equal(fast, full)


def test_it_resamples_whole_repeats_and_the_requests_within_them():
    rs = resampling([5, 7], resamples=50, rng=np.random.default_rng(1))
    # Row 0 is the full sample, rows 1 and 2 each repeat alone.
    assert rs.counts[0].tolist() == [1] * 12
    assert rs.counts[1].tolist() == [1] * 5 + [0] * 7
    boot = rs.counts[3:]
    # Each replicate holds as many requests as its drawn repeats.
    np.testing.assert_array_equal(boot[:, :5].sum(axis=1), rs.repeat_mult[:, 0] * 5)
    np.testing.assert_array_equal(boot[:, 5:].sum(axis=1), rs.repeat_mult[:, 1] * 7)
    assert (rs.repeat_mult.sum(axis=1) == 2).all()
    again = resampling([5, 7], resamples=50, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(rs.counts, again.counts)
