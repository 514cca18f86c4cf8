"""The statistical rules behind the verdict. Pure (numpy and scipy only).

docs/ANALYSIS.md ("How much the verdict can be trusted") states each rule and why:

- ``judgeable_n``: the fewest requests a quantile can be judged from at all;
- ``block_length``: the block of consecutive requests the bootstrap draws;
- ``family_resamples``: how many bootstrap draws a family of tests needs;
- ``holm``: family-wise control of the gains a retune may rest on;
- ``share_breaks``: an exact binomial test of a contract limit;
- ``repeats_p_worse``: whether a harm stands out from the run-to-run spread of the repeats;
- ``detectable``: the smallest change the design finds with the stated power;
- ``planned_power``: the same figure before any run, from the planned request counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy.stats import binom
from scipy.stats import t as student_t

# Power the design is judged by: the chance of finding a true change of the stated size.
POWER = 0.80
# The level at which a quantile becomes judgeable (one-sided, see judgeable_n).
JUDGEABLE_ALPHA = 0.05


def judgeable_n(q: float, alpha: float = JUDGEABLE_ALPHA) -> int:
    """Fewest requests from which the q-quantile is judgeable, by order statistics.

    The largest of n values lies above the q-quantile with probability 1 - q**n,
    so it is a one-sided (1 - alpha) upper confidence bound for the quantile only
    when q**n <= alpha, i.e. n >= ln(alpha) / ln(q): 299 for p99, 59 for p95,
    2995 for p99.9. Below that even the maximum does not bound the quantile, so a
    "p99" read off fewer values is a number without a meaning.
    """
    if not 0 < q < 1:
        raise ValueError("q must be in (0, 1)")
    return math.ceil(math.log(alpha) / math.log(q) - 1e-9)


def block_length(n: int) -> int:
    """Block of consecutive requests (arrival order) the bootstrap draws within one run.

    ceil(sqrt(n)): long enough to keep a queueing episode's neighbours together
    (a backlog lasts tens of requests) and still sqrt(n) blocks to draw from.
    """
    return max(1, math.ceil(math.sqrt(max(0, n))))


def family_resamples(minimum: int, family: int, alpha: float, *, per_threshold: int = 5) -> int:
    """Draws enough that Holm's strictest threshold alpha / m has ``per_threshold`` draws beyond it."""
    need = math.ceil(per_threshold * max(1, family) / alpha)
    # Rounded up to a whole thousand so small changes of the family do not change every draw.
    return max(minimum, -(-need // 1000) * 1000)


def holm(pvalues: Sequence[float], alpha: float) -> tuple[list[float], list[bool]]:
    """Holm's step-down adjustment: adjusted p-values and which hypotheses are rejected at alpha.

    1. Order the m p-values ascending: p(1) <= ... <= p(m).
    2. Adjusted p(i) = max over j <= i of min(1, (m - j + 1) * p(j)).
    3. Reject exactly those whose adjusted p-value is <= alpha.

    The chance of rejecting any true null hypothesis is at most alpha, whatever
    the dependence between the tests.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (pvalues[i], i))
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted, [a <= alpha for a in adjusted]


def share_breaks(over: int, n: int, limit_share: float, alpha: float) -> tuple[bool, float]:
    """Is the share of requests over a limit above ``limit_share`` with confidence 1 - alpha?

    Exact one-sided binomial test: p = P(X >= over) for X ~ Binomial(n, limit_share).
    A p99 limit allows 1% of requests over it; an error-rate limit allows that rate.
    Returns (broken, p-value). With no requests nothing is broken.
    """
    if n <= 0 or over <= 0:
        return False, 1.0
    if limit_share <= 0:
        return True, 0.0
    p = float(binom.sf(over - 1, n, limit_share))
    return p <= alpha, p


def repeats_p_worse(
    candidate: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool = False,
) -> float | None:
    """One-sided p-value that the candidate is worse, from the repeats' own values alone.

    The bootstrap draws requests within runs, so it cannot see a run that was
    slower as a whole (the host busy with something else, a noisy neighbour):
    with two repeats a side, two slow candidate runs look like a regression.
    This test takes each repeat's value as one observation and asks whether the
    candidate's mean is worse than B0's by more than the spread between repeats
    explains: Student's two-sample t with the variance pooled over both sides
    (under "no change" both sides share one distribution, so pooling is exact
    there), on the log scale when every value is positive (a slower host scales
    a tail latency) and on the plain scale otherwise. Its degrees of freedom
    are the repeats less two, so two repeats a side give 2.

    ``None`` when a side has fewer than two repeats (no spread to compare with);
    1.0 when a B0 repeat is unbounded (censored: it supports no claim that the
    candidate is worse). Pass a censored candidate repeat as its lower bound.
    """
    c = np.asarray(candidate, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if c.size < 2 or b.size < 2 or np.isnan(c).any() or np.isnan(b).any():
        return None
    if not np.isfinite(b).all():
        return 1.0
    if not np.isfinite(c).all():
        return None
    if (c > 0).all() and (b > 0).all():
        c, b = np.log(c), np.log(b)
    harm = float(b.mean() - c.mean()) if higher_is_better else float(c.mean() - b.mean())
    df = c.size + b.size - 2
    pooled = (float(((c - c.mean()) ** 2).sum()) + float(((b - b.mean()) ** 2).sum())) / df
    se = math.sqrt(pooled * (1 / c.size + 1 / b.size))
    if se == 0:
        return 0.0 if harm > 0 else 1.0
    return float(student_t.sf(harm / se, df))


def z(p: float) -> float:
    return NormalDist().inv_cdf(p)


def detectable(se_diff: float, *, alpha: float, family: int, power: float = POWER) -> float:
    """Smallest true difference found with ``power`` by a one-sided test at alpha / family.

    (z(1 - alpha/m) + z(power)) * SE of the difference: Bonferroni's level, the
    strictest Holm step, so the figure holds for the first rejection.
    """
    if not math.isfinite(se_diff):
        return math.inf
    return (z(1 - alpha / max(1, family)) + z(power)) * se_diff


def quantile_rel_se(q: float, n: int) -> float:
    """Relative standard error of the empirical q-quantile of n values from an exponential tail.

    Asymptotically SE = sqrt(q (1 - q) / n) / f(x_q); for an exponential tail
    f(x_q) = (1 - q) * rate and x_q = -ln(1 - q) / rate, so relative to x_q it is
    sqrt(q / ((1 - q) n)) / -ln(1 - q). Queueing delays have such tails; lighter
    tails give smaller errors, correlated requests larger ones.
    """
    if n <= 0:
        return math.inf
    return math.sqrt(q / ((1 - q) * n)) / -math.log(1 - q)


@dataclass(frozen=True)
class PlannedPoint:
    mixture: str
    rate: str
    cls: str
    requests: int  # pooled over repeats
    level: str | None  # "p99", "p95" or None: not judgeable
    metric: str
    detectable_rel: float | None  # smallest detectable change relative to B0, with POWER


QUANTILE_OF_LEVEL = {"p99": 0.99, "p95": 0.95}


def judged_level(n: int) -> str | None:
    """The level a tail metric is judged at from n requests: p99, else p95, else none."""
    for level in ("p99", "p95"):
        if n >= judgeable_n(QUANTILE_OF_LEVEL[level]):
            return level
    return None


def planned_power(
    *,
    classes: Sequence[Mapping[str, object]],
    mixtures: Mapping[str, Mapping[str, float]],
    rates: Mapping[str, float],
    repeats: int,
    observation_s: float,
    candidates: int,
    alpha: float,
    primary: Mapping[str, str],
    agreed_rates: Sequence[str] | None = None,
) -> list[PlannedPoint]:
    """The smallest improvement each class's primary metric can show, from the planned request counts.

    Requests per point = rate x observation x the class's share x repeats. The
    family is candidates x classes x agreed points, as in the analysis. The
    estimate assumes independent requests with an exponential tail
    (quantile_rel_se) for both B0 and the candidate.
    """
    points = [(m, r) for m in mixtures for r in rates if agreed_rates is None or r in agreed_rates]
    family = 0
    rows: list[tuple[str, str, str, int]] = []
    for mix, rate in points:
        weights = mixtures[mix]
        total = sum(w for w in weights.values() if w > 0) or 1.0
        for c in classes:
            name = str(c["name"])
            share = float(weights.get(name, 0.0) or 0.0) / total
            if share <= 0:
                continue
            n = int(float(rates[rate]) * observation_s * share) * max(1, repeats)
            rows.append((mix, rate, name, n))
            family += max(1, candidates)
    out = []
    for mix, rate, name, n in rows:
        level = judged_level(n)
        metric = primary[name]
        if level is None:
            out.append(PlannedPoint(mix, rate, name, n, None, metric, None))
            continue
        se = math.sqrt(2.0) * quantile_rel_se(QUANTILE_OF_LEVEL[level], n)
        rel = detectable(se, alpha=alpha, family=family)
        out.append(PlannedPoint(mix, rate, name, n, level, metric.replace("_p99_", f"_{level}_"), rel))
    return out
