from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.analysis.resample import Resampling, TailQuantile, _block_cover


def _sorted_quantile(values: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """The nearest-rank quantile by expanding every row: the slow, obvious way."""
    out = []
    for row in counts:
        expanded = np.sort(np.repeat(values, row))
        k = max(1, int(np.ceil(q * expanded.size - 1e-9)))
        out.append(expanded[k - 1])
    return np.asarray(out)


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.one_of(st.floats(0, 1e4), st.just(float("inf"))), min_size=1, max_size=400),
    seed=st.integers(0, 2**31),
    q=st.sampled_from([0.5, 0.95, 0.99]),
)
def test_it_gets_the_same_quantile_from_the_tail_as_from_all_values(values, seed, q):
    v = np.asarray(values)
    split = sorted({0, v.size // 3, v.size})
    rs = Resampling([b - a for a, b in zip(split, split[1:], strict=False)], 30, [seed])
    counts = np.vstack([rs.fixed(), *(c for c, _ in rs.chunks())])
    fast = TailQuantile(v, q).of(counts, counts.sum(axis=1, dtype=np.int64))
    np.testing.assert_array_equal(fast, _sorted_quantile(v, counts, q))


def test_it_resamples_whole_repeats_and_the_requests_within_them():
    rs = Resampling([5, 7], 50, [1])
    fixed = rs.fixed()
    # Row 0 is the full sample, rows 1 and 2 each repeat alone.
    assert fixed[0].tolist() == [1] * 12
    assert fixed[1].tolist() == [1] * 5 + [0] * 7
    boot, mult = next(rs.chunks())
    # Each replicate holds as many requests as its drawn repeats.
    np.testing.assert_array_equal(boot[:, :5].sum(axis=1), mult[:, 0] * 5)
    np.testing.assert_array_equal(boot[:, 5:].sum(axis=1), mult[:, 1] * 7)
    assert (mult.sum(axis=1) == 2).all()
    again, _ = next(Resampling([5, 7], 50, [1]).chunks())
    np.testing.assert_array_equal(boot, again)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 90), min_size=1, max_size=4), seed=st.integers(0, 2**31))
def test_it_covers_each_drawn_repeat_with_whole_circular_blocks(sizes, seed):
    rs = Resampling(sizes, 25, [seed])
    rng = np.random.default_rng(seed)
    for r, n in enumerate(sizes):
        lens = rs.lens(r)
        starts = rng.integers(0, n, size=(5, lens.size))
        slow = np.zeros((5, n), dtype=np.int64)
        for i in range(5):
            for s, length in zip(starts[i], lens, strict=True):
                np.add.at(slow[i], np.arange(s, s + length) % n, 1)
        np.testing.assert_array_equal(_block_cover(starts, lens, n), slow)
        assert (slow.sum(axis=1) == n).all()
