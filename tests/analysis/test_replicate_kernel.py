"""The fused replicate kernel (apps/analysis/replicate_kernel.py) gives the numpy path's numbers
bit for bit: the same draws, good counts and tail quantiles, fallback rows included."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.analysis import compare, resample
from apps.analysis.compare_options import LATENCY_KINDS
from apps.analysis.resample import FusedReplicates, Resampling, TailQuantile


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
    )


def _both_ways(rs: Resampling, goods: np.ndarray, quantiles: list[TailQuantile]) -> None:
    """Every slice of replicates: the numpy path (counts, float32 product, of_t) vs the kernel."""
    sizes = np.asarray(rs.sizes, dtype=np.int64)
    fused = FusedReplicates(rs, goods, quantiles)
    slices = 0
    for (counts, mult), d in zip(rs.chunks(), rs.draws(), strict=True):
        np.testing.assert_array_equal(mult, d.mult)
        total = mult @ sizes
        good, qs = fused.of(d, total)
        _same_bits(good, (counts.astype(np.float32) @ goods.astype(np.float32)).astype(np.float64))
        counts_t = np.ascontiguousarray(counts.T)
        for t, tq in enumerate(quantiles):
            _same_bits(np.ascontiguousarray(qs[:, t]), tq.of_t(counts_t, total))
        slices += 1
    assert slices == -(-rs.resamples // max(16, resample.CHUNK_CELLS // max(1, rs.total)))


_value = st.one_of(
    st.integers(0, 30).map(float),  # many ties
    st.floats(0, 1e4, allow_nan=False),
    st.just(float("inf")),
    st.just(float("nan")),
    st.just(-0.0),
)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 120), min_size=1, max_size=4),
    data=st.data(),
    seed=st.integers(0, 2**31),
    resamples=st.integers(1, 70),
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_it_equals_the_numpy_path_on_random_values(sizes, data, seed, resamples, q):
    n = sum(sizes)
    values = np.asarray(data.draw(st.lists(_value, min_size=n, max_size=n)))
    goods = np.asarray(data.draw(st.lists(st.booleans(), min_size=2 * n, max_size=2 * n))).reshape(n, 2)
    rs = Resampling(sizes, resamples, [seed])
    # Small slices: several per call, the last one partial.
    with mock.patch.object(resample, "CHUNK_CELLS", 300):
        _both_ways(
            rs, goods.astype(np.float32), [TailQuantile(values, q), TailQuantile(values[::-1].copy(), 0.99)]
        )


def test_it_recounts_the_replicates_whose_quantile_lies_below_the_tail(monkeypatch):
    # The largest values all in the first repeat: a replicate that did not draw it finds none of
    # its tail's positions and falls back to every value.
    sizes = [300, 250, 200]
    rng = np.random.default_rng(3)
    values = np.concatenate([1000 + rng.random(300), rng.integers(0, 40, 450).astype(float)])
    values[5] = np.inf
    values[400] = np.nan
    tq = TailQuantile(values, 0.99)
    assert tq.tail < values.size
    calls = []
    full = TailQuantile._full

    def spy(self, counts_t, total):
        calls.append(total.size)
        return full(self, counts_t, total)

    monkeypatch.setattr(TailQuantile, "_full", spy)
    rs = Resampling(sizes, 400, [11, 2])
    _both_ways(rs, (rng.random((750, 3)) < 0.7).astype(np.float32), [tq, TailQuantile(values, 0.95)])
    assert sum(calls) > 0  # the fallback ran (in both paths)


def test_it_equals_the_numpy_path_with_one_repeat_and_at_a_slice_boundary(monkeypatch):
    rng = np.random.default_rng(8)
    values = np.round(rng.exponential(50, 500))  # ties
    goods = (rng.random((500, 1)) < 0.5).astype(np.float32)
    _both_ways(Resampling([500], 90, [4]), goods, [TailQuantile(values, 0.99), TailQuantile(values, 0.5)])
    # 16 replicates per slice: 64 is four whole slices, 65 one more of a single replicate.
    monkeypatch.setattr(resample, "CHUNK_CELLS", 16 * 500)
    for resamples in (64, 65):
        _both_ways(Resampling([200, 180, 120], resamples, [4, 9]), goods, [TailQuantile(values, 0.99)])


def test_it_equals_the_numpy_path_with_an_empty_repeat_or_no_requests():
    rng = np.random.default_rng(5)
    values = rng.integers(0, 9, 150).astype(float)
    goods = (rng.random((150, 2)) < 0.5).astype(np.float32)
    _both_ways(
        Resampling([90, 0, 60], 40, [6]), goods, [TailQuantile(values, 0.99), TailQuantile(values, 0.5)]
    )
    _both_ways(Resampling([0, 0], 20, [6]), np.zeros((0, 2), np.float32), [TailQuantile(np.zeros(0), 0.99)])


def _sides(rng: np.random.Generator, n: int, names: list[str]) -> dict[str, compare.Side]:
    out = {}
    for name in names:
        hi, lo = {}, {}
        for kind in LATENCY_KINDS:
            v = np.round(rng.lognormal(4, 1, n))
            v[rng.random(n) < 0.02] = np.inf
            hi[kind] = v
            lo[kind] = np.where(np.isinf(v), 5000.0, v) if kind != "ttft" else v
        out[name] = compare.Side(good=(rng.random(n) < 0.9).astype(np.float32), hi=hi, lo=lo)
    return out


@pytest.mark.parametrize("sizes", [[400, 380, 410], [700]])
def test_every_sides_rows_are_the_numpy_paths(sizes, monkeypatch):
    rng = np.random.default_rng(sum(sizes))
    sides = _sides(rng, sum(sizes), ["", "a", "b"])
    kw = {
        "levels": ["p99", "p95"],
        "obs_s": [60.0 + r for r in range(len(sizes))],
        "hists": {name: [None] * len(sizes) for name in sides},
    }
    fused = compare._rows_of_sides(sides, Resampling(sizes, 300, [1, 2]), **kw)
    monkeypatch.setattr(compare, "FUSED_MAX_TOTAL", 0)  # the numpy path for every slice
    plain = compare._rows_of_sides(sides, Resampling(sizes, 300, [1, 2]), **kw)
    assert list(fused) == list(plain)
    for name in plain:
        assert list(fused[name]) == list(plain[name])
        for metric, rows in plain[name].items():
            _same_bits(fused[name][metric].hi, rows.hi)
            _same_bits(fused[name][metric].lo, rows.lo)


def test_it_compiles_in_memory_where_no_cache_folder_can_be_written(monkeypatch):
    # Every cache folder unwritable (as for a user who owns neither the code nor a home):
    # numba refuses cache=True at decoration; the kernel's decorator compiles in memory.
    from numba.core import caching

    from apps.analysis import replicate_kernel

    def unwritable(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(caching._CacheLocator, "ensure_cache_path", unwritable)

    def plus_one(x):
        return x + 1

    with pytest.raises(RuntimeError, match="no locator available"):
        replicate_kernel.numba.njit(cache=True)(plus_one)
    assert replicate_kernel._jit(plus_one)(41) == 42
