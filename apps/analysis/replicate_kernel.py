"""The bootstrap's replicates in one fused pass per replicate (numba). Pure.

numpy reads a chunk of replicates as a (replicates x requests) count matrix and walks it
several times: once to build it, once per side for the good requests, once to transpose it,
once per tail quantile. This kernel takes the same draws (``resample.Draws``) and, one
replicate at a time, builds its coverage counts in a scratch buffer of ``total`` ints that
stays in cache, then reads from it every side's good requests and every tail quantile.
The answers are the numpy path's, exactly (tests/analysis/test_replicate_kernel.py).

Compiled on first use and cached on disk (numba's cache: ``__pycache__`` next to this file,
else the user's cache folder, or ``NUMBA_CACHE_DIR``); a process that can write none of
them compiles in memory instead (docs/ANALYSIS.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np


def _jit(fn: Callable[..., Any]) -> Any:
    """njit with an on-disk cache where one can be written, else compiled per process."""
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(cache=False, nogil=True)(fn)


def _replicates(
    ent_rep: np.ndarray,
    ent_off: np.ndarray,
    ent_count: np.ndarray,
    starts: np.ndarray,
    seg_scratch: np.ndarray,
    seg_global: np.ndarray,
    seg_n: np.ndarray,
    lens_ptr: np.ndarray,
    lens: np.ndarray,
    prefix: np.ndarray,
    top_idx: np.ndarray,
    top_val: np.ndarray,
    top_ptr: np.ndarray,
    need: np.ndarray,
    totals: np.ndarray,
    scratch_size: int,
    good_out: np.ndarray,
    q_out: np.ndarray,
    exhausted: np.ndarray,
) -> None:
    """Per replicate i (a row of ``ent_*``):

    - coverage: repeat instance j of replicate i is repeat ``ent_rep[i, j]`` with its block
      starts at ``starts[ent_off[i, j]:]`` (one per block, lengths ``lens[lens_ptr[r]:lens_ptr[r+1]]``);
      a difference array per repeat segment (segment r at ``seg_scratch[r]``, n + 1 wide: its end
      slot closes every block, wrapped or not, so one running sum over the whole buffer is each
      segment's coverage), as resample._block_cover does (a block wraps circularly in its repeat);
    - good requests per side: ``prefix`` holds each side's running count of good requests
      (positions x sides, one more row than positions), read at each block's two ends;
    - tail quantile t: its top positions (largest value first) as scratch indices (unsigned)
      ``top_idx[top_ptr[t]:top_ptr[t+1]]`` and their values ``top_val``; the answer is the value
      where the running count first reaches ``need[t, i]``; NaN where the replicate is empty,
      NaN and ``exhausted`` where the tail runs out first (the caller recounts those rows).
    """
    n_quant = top_ptr.size - 1
    n_sides = prefix.shape[1]
    cov = np.empty(scratch_size, dtype=np.int32)
    goods = np.zeros(n_sides, dtype=np.int64)
    for i in range(ent_rep.shape[0]):
        cov[:] = 0
        goods[:] = 0
        for j in range(ent_count[i]):
            r = ent_rep[i, j]
            off = ent_off[i, j]
            base = seg_scratch[r]
            glob = seg_global[r]
            n = seg_n[r]
            lo = lens_ptr[r]
            for b in range(lens_ptr[r + 1] - lo):
                s = starts[off + b]
                e = s + lens[lo + b]
                cov[base + s] += 1
                if e > n:
                    cov[base + e - n] -= 1
                    cov[base] += 1
                    cov[base + n] -= 1  # every segment's differences sum to 0: one running sum
                    for k in range(n_sides):
                        goods[k] += (
                            prefix[glob + n, k]
                            - prefix[glob + s, k]
                            + prefix[glob + e - n, k]
                            - prefix[glob, k]
                        )
                else:
                    cov[base + e] -= 1
                    for k in range(n_sides):
                        goods[k] += prefix[glob + e, k] - prefix[glob + s, k]
        # Unsigned loop indices here and in the walk below: numba then skips its check for
        # negative indices, which otherwise costs about a third of these loops.
        run = 0
        for p in range(np.uint64(scratch_size)):
            run += cov[p]
            cov[p] = run
        for k in range(n_sides):
            good_out[i, k] = goods[k]
        for t in range(n_quant):
            if totals[i] <= 0:
                q_out[i, t] = math.nan
                continue
            want = need[t, i]
            got = 0
            found = False
            for p in range(np.uint64(top_ptr[t]), np.uint64(top_ptr[t + 1])):
                got += cov[top_idx[p]]
                if got >= want:
                    q_out[i, t] = top_val[p]
                    found = True
                    break
            if not found:
                q_out[i, t] = math.nan
                exhausted[i, t] = True


replicates = _jit(_replicates)
