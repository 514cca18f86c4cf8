"""The bootstrap's draws and the quantiles under them. Pure (numpy only).

``Resampling`` draws, per replicate, the repeats with replacement and, within
each drawn repeat, circular blocks of consecutive requests in arrival order
(docs/ANALYSIS.md); ``TailQuantile`` reads a high quantile under many
replicates from the largest values only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from apps.analysis import inference

# Bootstrap replicates expanded at once: bounds memory to about this many counts.
CHUNK_CELLS = 4_000_000


@dataclass
class Resampling:
    """The replicates of one (mixture, rate, class): which repeats, and which blocks within them.

    Columns are the repeats' frames concatenated (each frame in arrival order).
    ``fixed()`` holds the full sample (row 0) and each repeat alone (rows 1..R) as
    plain counts; ``chunks()`` yields the bootstrap replicates, the same ones on
    every call.
    """

    sizes: list[int]
    resamples: int
    seed: Sequence[int]
    blocks: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.blocks = [inference.block_length(n) for n in self.sizes]

    @property
    def n_repeats(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        return int(sum(self.sizes))

    @property
    def offsets(self) -> list[int]:
        return [int(x) for x in np.concatenate([[0], np.cumsum(self.sizes)[:-1]])] if self.sizes else []

    def fixed(self) -> np.ndarray:
        out = np.zeros((1 + self.n_repeats, self.total), dtype=np.int32)
        out[0] = 1
        for r, (o, n) in enumerate(zip(self.offsets, self.sizes, strict=True)):
            out[1 + r, o : o + n] = 1
        return out

    def fixed_mult(self) -> np.ndarray:
        return np.vstack(
            [np.ones((1, self.n_repeats), dtype=np.int64), np.eye(self.n_repeats, dtype=np.int64)]
        )

    def lens(self, r: int) -> np.ndarray:
        n, b = self.sizes[r], self.blocks[r]
        k = -(-n // b)
        out = np.full(k, b, dtype=np.int64)
        out[-1] = n - (k - 1) * b
        return out

    def draws(self) -> Iterator[Draws]:
        """The bootstrap's draws for consecutive slices of the replicates, the same on every call."""
        rng = np.random.default_rng(list(self.seed))
        n_rep, total = self.n_repeats, self.total
        per_chunk = max(16, CHUNK_CELLS // max(1, total))
        done = 0
        while done < self.resamples:
            c = min(per_chunk, self.resamples - done)
            picks = rng.integers(0, n_rep, size=(c, n_rep)) if n_rep else np.zeros((c, 0), dtype=np.int64)
            mult = np.stack([(picks == r).sum(axis=1) for r in range(n_rep)], axis=1).astype(np.int64)
            groups: list[tuple[int, np.ndarray, np.ndarray]] = []
            for r, n in enumerate(self.sizes):
                k = -(-n // self.blocks[r]) if n else 0
                for inst in range(int(mult[:, r].max()) if c and n else 0):
                    active = np.flatnonzero(mult[:, r] > inst)
                    groups.append((r, active, rng.integers(0, n, size=(active.size, k))))
            done += c
            yield Draws(mult=mult, groups=groups)

    def cover(self, d: Draws, rows: np.ndarray | None = None) -> np.ndarray:
        """The replicates' counts (replicates x positions) under their draws; only ``rows``
        (ascending replicate indices within the slice) when given."""
        offsets = self.offsets
        counts = np.zeros((d.mult.shape[0] if rows is None else rows.size, self.total), dtype=np.int32)
        for r, active, starts in d.groups:
            o, n = offsets[r], self.sizes[r]
            if rows is None:
                counts[active, o : o + n] += _block_cover(starts, self.lens(r), n)
                continue
            mine = np.isin(active, rows)
            if mine.any():
                at = np.searchsorted(rows, active[mine])
                counts[at, o : o + n] += _block_cover(starts[mine], self.lens(r), n)
        return counts

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(counts, repeat multiplicities) for consecutive slices of the replicates."""
        for d in self.draws():
            yield self.cover(d), d.mult


@dataclass(frozen=True)
class Draws:
    """One slice of the replicates' draws: ``mult`` (replicates x repeats) how often each repeat
    was drawn; ``groups`` per (repeat, instance) in draw order: the repeat, the replicates that
    drew it that often (ascending) and their circular blocks' starts (those x the repeat's blocks)."""

    mult: np.ndarray
    groups: list[tuple[int, np.ndarray, np.ndarray]]


def _block_cover(starts: np.ndarray, lens: np.ndarray, n: int) -> np.ndarray:
    """Per row, how often each of n positions is covered by its circular blocks.

    A difference array: +1 where a block starts, -1 where it ends; a block that
    wraps past n ends at its overflow and adds +1 at position 0; the running sum
    along each row is the coverage.
    """
    rows = starts.shape[0]
    width = n + 1
    base = (np.arange(rows, dtype=np.int64) * width)[:, None]
    ends = starts + lens[None, :]
    wrap = ends > n
    size = rows * width
    diff = np.bincount((base + starts).ravel(), minlength=size).astype(np.int32)
    diff -= np.bincount((base + np.where(wrap, ends - n, ends)).ravel(), minlength=size).astype(np.int32)
    diff[base[:, 0]] += wrap.sum(axis=1).astype(np.int32)
    return diff.reshape(rows, width).cumsum(axis=1, dtype=np.int32)[:, :n]


@functools.lru_cache(maxsize=64)
def _tie_order(n: int) -> np.ndarray:
    """A fixed pseudo-random rank per position (seeded by n), read-only: shared by every quantile
    of a point and by both seeds."""
    out = np.random.default_rng(n).permutation(n)
    out.setflags(write=False)
    return out


@dataclass
class TailCache:
    """TailQuantiles of one point's sides, kept across the seeds of one sweep's judging (their
    values do not depend on the seed, only the draws do). ``point`` names the point."""

    point: str
    kept: dict[tuple[str, ...], TailQuantile]

    def quantile(self, key: tuple[str, ...], values: np.ndarray, q: float) -> TailQuantile:
        """The kept TailQuantile of ``key`` where its values and q are these, else a new one."""
        kept = self.kept.get((self.point, *key))
        if kept is None or kept.q != q or not np.array_equal(kept.values, values, equal_nan=True):
            kept = self.kept[(self.point, *key)] = TailQuantile(values, q)
        return kept


class TailQuantile:
    """Nearest-rank q-quantile of fixed values under many replicates; +inf ranks last.

    A high quantile of a resample almost always lies among the largest values,
    so ranks are counted down from the top over a tail a few times wider than
    needed; the rare row whose quantile falls below that tail is recomputed over
    all values (the answer is exact either way: tied values are equal).
    """

    def __init__(self, values: np.ndarray, q: float) -> None:
        self.values = values
        self.q = q
        n = values.size
        # Ties in a fixed pseudo-random order: tied values are equal, so any order gives the
        # same answer, but ordering them by position would put the whole tail in the last
        # repeat's requests, outside every replicate that did not draw it.
        self._shuffle = _tie_order(n)
        self._order: np.ndarray | None = None
        self.tail = n if q < 0.9 else min(n, max(64, int(math.ceil((1 - q) * n * 4))))
        if self.tail == n:
            self.top = self.order[::-1]  # largest first
        else:
            # Only the tail is sorted: every value at or above the tail-th largest (ties at the
            # edge included), ordered as the full sort orders them, the largest `tail` kept.
            edge = np.partition(values, n - self.tail)[n - self.tail]
            near = np.flatnonzero((values >= edge) | np.isnan(values))
            ranked = near[np.lexsort((self._shuffle[near], values[near]))]
            self.top = ranked[ranked.size - self.tail :][::-1]

    @property
    def order(self) -> np.ndarray:
        """Every position, smallest value first (ties in the fixed shuffled order); sorted when
        first needed: only a replicate whose quantile falls below the tail reads it."""
        if self._order is None:
            self._order = np.lexsort((self._shuffle, self.values))
        return self._order

    def _full(self, counts_t: np.ndarray, total: np.ndarray) -> np.ndarray:
        cum = np.cumsum(counts_t[self.order], axis=0, dtype=self._cum_dtype(total))
        k = np.maximum(1, np.ceil(self.q * total - 1e-9)).astype(np.int64)
        pos = (cum < k[None, :]).sum(axis=0)
        return self.values[self.order[np.minimum(pos, self.values.size - 1)]]

    def _from_top(self, top_t: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = np.full(top_t.shape[1], np.nan)
        k = np.maximum(1, np.ceil(self.q * total - 1e-9)).astype(np.int64)
        need = total - k + 1  # the k-th smallest is the (total - k + 1)-th largest
        dtype = self._cum_dtype(total)
        # The rank counted over the tail's first half, then over the rest only for the replicates
        # it did not reach in the first (the quantile lies about a quarter of the way down the tail).
        half = max(1, self.tail // 2)
        cum = np.cumsum(top_t[:half], axis=0, dtype=dtype)
        pos = (cum < need[None, :]).sum(axis=0)
        deeper = np.flatnonzero(pos >= half)
        if deeper.size and self.tail > half:
            rest = np.cumsum(top_t[half:, deeper], axis=0, dtype=dtype) + cum[-1, deeper][None, :]
            pos[deeper] = half + (rest < need[deeper][None, :]).sum(axis=0)
        inside = (pos < self.tail) & (total > 0)
        out[inside] = self.values[self.top[pos[inside]]]
        return out, np.flatnonzero(~inside & (total > 0))

    @staticmethod
    def _cum_dtype(total: np.ndarray) -> type[np.signedinteger]:
        # A running count never exceeds the replicate's total: int32 while that fits, as it
        # always does here (a replicate holds its point's requests, far below 2**31).
        return np.int32 if total.size == 0 or int(total.max()) < 2**31 - 1 else np.int64

    def of(self, counts: np.ndarray, total: np.ndarray) -> np.ndarray:
        """Under each row of plain counts."""
        return self.of_t(np.ascontiguousarray(counts.T), total)

    def of_t(self, counts_t: np.ndarray, total: np.ndarray) -> np.ndarray:
        """Under each column of plain counts given transposed (positions x replicates, C order):
        the tail's positions are then whole rows, read without a gather across the matrix."""
        if self.values.size == 0:
            return np.full(counts_t.shape[1], np.nan)
        out, rest = self._from_top(counts_t[self.top], total)
        if rest.size:
            out[rest] = self._full(counts_t[:, rest], total[rest])
        return out


class FusedReplicates:
    """Every side's good requests and every tail quantile under the bootstrap replicates of
    ``rs``, by the fused kernel (apps/analysis/replicate_kernel.py): the same numbers as
    ``rs.cover`` then ``counts @ goods`` and ``TailQuantile.of_t``, without the count matrix.

    ``goods`` is positions x sides, 0 or 1. The good counts are exact integers, as the float32
    product of the numpy path is while every replicate holds fewer than 2**24 requests.
    """

    def __init__(self, rs: Resampling, goods: np.ndarray, quantiles: Sequence[TailQuantile]) -> None:
        from apps.analysis import replicate_kernel  # numba: loaded only where replicates are drawn

        self._kernel = replicate_kernel.replicates
        self.rs = rs
        self.quantiles = list(quantiles)
        sizes = np.asarray(rs.sizes, dtype=np.int64)
        offsets = np.asarray(rs.offsets, dtype=np.int64)
        self._sizes = sizes
        # Segment r of the scratch buffer is n_r + 1 wide (the difference array's end slot).
        self._seg_scratch = offsets + np.arange(sizes.size, dtype=np.int64)
        self._seg_global = offsets
        self._scratch_size = int(sizes.sum() + sizes.size)
        lens = [rs.lens(r) if n else np.zeros(0, dtype=np.int64) for r, n in enumerate(rs.sizes)]
        self._lens_ptr = np.concatenate([[0], np.cumsum([x.size for x in lens])]).astype(np.int64)
        self._lens = np.concatenate(lens).astype(np.int64) if lens else np.zeros(0, dtype=np.int64)
        g = np.asarray(goods).astype(np.int64)
        self._prefix = np.vstack([np.zeros((1, g.shape[1]), dtype=np.int64), np.cumsum(g, axis=0)])
        segment = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
        tops = [tq.top.astype(np.int64) for tq in self.quantiles]
        self._top_ptr = np.concatenate([[0], np.cumsum([t.size for t in tops])]).astype(np.int64)
        # Unsigned: the kernel's gathers skip numba's check for negative indices.
        self._top_idx = (np.concatenate([t + segment[t] for t in tops]) if tops else np.zeros(0)).astype(
            np.uint32
        )
        self._top_val = (
            np.concatenate([tq.values[t] for tq, t in zip(self.quantiles, tops, strict=True)]).astype(
                np.float64
            )
            if tops
            else np.zeros(0)
        )

    def of(self, d: Draws, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(good requests: replicates x sides, quantiles: replicates x quantiles) under one slice
        of draws whose replicates hold ``total`` requests each."""
        c, n_rep = d.mult.shape
        ent_rep = np.zeros((c, max(1, n_rep)), dtype=np.int64)
        ent_off = np.zeros((c, max(1, n_rep)), dtype=np.int64)
        ent_count = np.zeros(c, dtype=np.int64)
        flat: list[np.ndarray] = []
        at = 0
        for r, active, starts in d.groups:
            slot = ent_count[active]
            ent_rep[active, slot] = r
            ent_off[active, slot] = at + np.arange(active.size, dtype=np.int64) * starts.shape[1]
            ent_count[active] += 1
            flat.append(starts.ravel())
            at += starts.size
        starts_flat = np.concatenate(flat).astype(np.int64) if flat else np.zeros(0, dtype=np.int64)
        total = np.asarray(total, dtype=np.int64)
        need = np.zeros((len(self.quantiles), c), dtype=np.int64)
        for t, tq in enumerate(self.quantiles):
            k = np.maximum(1, np.ceil(tq.q * total - 1e-9)).astype(np.int64)
            need[t] = total - k + 1  # the k-th smallest is the (total - k + 1)-th largest
        good = np.zeros((c, self._prefix.shape[1]), dtype=np.float64)
        out = np.zeros((c, len(self.quantiles)), dtype=np.float64)
        exhausted = np.zeros((c, len(self.quantiles)), dtype=np.bool_)
        self._kernel(
            ent_rep,
            ent_off,
            ent_count,
            starts_flat,
            self._seg_scratch,
            self._seg_global,
            self._sizes,
            self._lens_ptr,
            self._lens,
            self._prefix,
            self._top_idx,
            self._top_val,
            self._top_ptr,
            need,
            total,
            self._scratch_size,
            good,
            out,
            exhausted,
        )
        # A replicate whose quantile lies below its tail (rare): its counts, then every value.
        rows = np.flatnonzero(exhausted.any(axis=1))
        if rows.size:
            counts_t = np.ascontiguousarray(self.rs.cover(d, rows).T)
            for col in np.flatnonzero(exhausted[rows].any(axis=0)):
                sel = exhausted[rows, col]
                out[rows[sel], col] = self.quantiles[col]._full(counts_t[:, sel], total[rows[sel]])
        return good, out


def warm_kernel() -> None:
    """Compile the kernel (or load it from the cache) on a tiny bootstrap, with the argument types
    FusedReplicates passes: ``make setup`` runs it so the first report does not compile."""
    rs = Resampling([40, 30], 20, [0])
    values = np.arange(70, dtype=np.float64)
    fused = FusedReplicates(rs, np.ones((70, 1), dtype=np.float32), [TailQuantile(values, 0.99)])
    for d in rs.draws():
        fused.of(d, d.mult @ np.asarray(rs.sizes, dtype=np.int64))
