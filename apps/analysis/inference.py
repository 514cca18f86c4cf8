"""The statistical rules behind the verdict. Pure (numpy and scipy only).

docs/ANALYSIS.md ("How much the verdict can be trusted") states each rule and why:

- ``judgeable_n``: the fewest requests a quantile can be judged from at all;
- ``block_length``: the block of consecutive requests the bootstrap draws;
- ``family_resamples``: how many bootstrap draws a family of tests needs;
- ``holm``: family-wise control of the gains a retune may rest on;
- ``share_breaks``: an exact binomial test of a contract limit;
- ``repeats_p_worse``: whether a harm stands out from the run-to-run spread of the repeats;
- ``repeats_pooled_sd``: that spread, the drift the gate allows for;
- ``rounds_fit`` / ``rounds_compare``: the run-level model every comparison's verdict also
  passes (cells x repeat rounds, the run the unit);
- ``run_spread``: one config's spread between whole runs, the noise floor;
- ``repeats_needed``: the repeats a design needs to find a change with the stated power;
- ``detectable``: the smallest change the design finds with the stated power;
- ``planned_power``: the same figure before any run, from the planned request counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from scipy import special
from scipy.stats import binom
from scipy.stats import t as student_t


def t_sf(x: float, df: float) -> float:
    """Student's t survival function: scipy.stats.t.sf's value, without its per-call argument
    handling (about 100 us a call, hundreds of calls a report) where the arguments are ordinary;
    scipy.stats.t itself is called for anything else (tests/analysis/test_statistics.py)."""
    if math.isfinite(x) and 0 < df < math.inf:
        return float(special.stdtr(df, -x))
    return float(student_t.sf(x, df))


def t_cdf(x: float, df: float) -> float:
    """Student's t distribution function, as t_sf."""
    if math.isfinite(x) and 0 < df < math.inf:
        return float(special.stdtr(df, x))
    return float(student_t.cdf(x, df))


def t_ppf(q: float, df: float) -> float:
    """Student's t quantile function, as t_sf (scipy returns its _ppf * scale + loc)."""
    if 0 < q < 1 and 0 < df < math.inf:
        return float(special.stdtrit(df, q) * 1.0 + 0.0)
    return float(student_t.ppf(q, df))


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
    return t_sf(harm / se, df)


def repeats_pooled_sd(
    candidate: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray
) -> float | None:
    """The spread between runs ``repeats_p_worse`` weighs a harm against, on the log scale: the
    standard deviation of the repeats' log values about their side's mean, pooled over both sides
    (df = the repeats less two). None where that test takes no log-scale spread: a side with
    fewer than two repeats, or a value unknown, unbounded or not positive."""
    c = np.asarray(candidate, dtype=float)
    b = np.asarray(baseline, dtype=float)
    both = np.concatenate([c, b])
    if c.size < 2 or b.size < 2 or not (np.isfinite(both).all() and (both > 0).all()):
        return None
    c, b = np.log(c), np.log(b)
    squares = float(((c - c.mean()) ** 2).sum()) + float(((b - b.mean()) ** 2).sum())
    return math.sqrt(squares / (c.size + b.size - 2))


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


@dataclass(frozen=True)
class RoundsFit:
    """The run-level model of one metric at one (mixture, rate, class).

    Each run (cell c, repeat round r) gives one value Y[c, r] of the metric (its p99 over that
    run's requests, its goodput...). On the log scale (the plain one when a value is not
    positive), Y[c, r] = cell effect + round effect + run noise: the round effect is what every
    cell of that round shares (the round's trace, the host's state that hour) and cancels in a
    paired difference; the run noise is the whole run faster or slower, plus the sampling noise
    of its own requests, independent across runs with one spread ``sd`` for the cells of the
    point. ``sd`` is the residual of that two-way fit, pooled over the cells with a finite value
    in every round: (cells - 1) x (rounds - 1) degrees of freedom.
    """

    scale: str  # "log" | "plain"
    rounds: int
    cells: tuple[str, ...]
    df: int
    sd: float


def _scale_of(values: Sequence[np.ndarray]) -> str:
    return "log" if all(bool((v > 0).all()) for v in values) else "plain"


def _on(scale: str, v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(v) if scale == "log" else v


def rounds_fit(values: Mapping[str, Sequence[float] | np.ndarray]) -> RoundsFit | None:
    """Fit the run-level model to each cell's per-round values (every cell the same rounds).

    Cells with an unknown or unbounded value in some round (a censored tail, a run that did not
    finish) stay out of the pool. None without two such cells and two rounds: no spread between
    runs can be estimated.
    """
    complete = {
        c: np.asarray(v, dtype=float)
        for c, v in values.items()
        if len(v) >= 2 and bool(np.isfinite(np.asarray(v, dtype=float)).all())
    }
    lengths = {v.size for v in complete.values()}
    if len(complete) < 2 or len(lengths) != 1:
        return None
    scale = _scale_of(list(complete.values()))
    y = np.vstack([_on(scale, v) for v in complete.values()])
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    cells, rounds = y.shape
    df = (cells - 1) * (rounds - 1)
    return RoundsFit(
        scale=scale,
        rounds=rounds,
        cells=tuple(complete),
        df=df,
        sd=math.sqrt(float((resid**2).sum()) / df),
    )


@dataclass(frozen=True)
class RoundsResult:
    """One candidate against B0 under the run-level model (``rounds_compare``)."""

    diff: float  # mean over rounds of candidate - B0, on the fit's scale (log: a log ratio)
    sd: float  # the run noise used: the pool's, or this pair's own when that is larger
    se: float
    df: int
    p_better: float
    p_worse: float
    ci: tuple[float, float]  # of ``diff``, two-sided at the given confidence


def rounds_compare(
    fit: RoundsFit,
    candidate: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool,
    confidence: float,
) -> RoundsResult | None:
    """Candidate against B0 round by round: Student's t on the mean paired difference.

    The standard error of the mean difference over R rounds is sqrt(2 sd^2 / R); ``sd`` is the
    pool's (``fit``) unless this pair's own differences spread more (their variance / 2), so a
    candidate noisier than the pool is never judged by the pool's calm. The degrees of freedom
    are the pool's. Pass the ends the claim is tested on (censored: a lower bound or +inf); a
    value that is not finite supports neither claim (both p-values 1). None when the values do
    not fit the model's scale or rounds.
    """
    c = np.asarray(candidate, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if c.size != fit.rounds or b.size != fit.rounds or np.isnan(c).any() or np.isnan(b).any():
        return None
    if fit.scale == "log" and ((c <= 0).any() or (b <= 0).any()):
        return None
    if not (np.isfinite(c).all() and np.isfinite(b).all()):
        return RoundsResult(math.nan, fit.sd, math.inf, fit.df, 1.0, 1.0, (-math.inf, math.inf))
    d = _on(fit.scale, c) - _on(fit.scale, b)
    diff = float(d.mean())
    pair_sd = math.sqrt(float(d.var(ddof=1)) / 2) if d.size > 1 else 0.0
    sd = max(fit.sd, pair_sd)
    se = math.sqrt(2 * sd * sd / fit.rounds)
    harm = -diff if higher_is_better else diff
    if se == 0:
        p_worse = 0.0 if harm > 0 else 1.0
        p_better = 0.0 if harm < 0 else 1.0
        return RoundsResult(diff, sd, se, fit.df, p_better, p_worse, (diff, diff))
    tval = harm / se
    half = t_ppf(1 - (1 - confidence) / 2, fit.df) * se
    return RoundsResult(
        diff=diff,
        sd=sd,
        se=se,
        df=fit.df,
        p_better=t_cdf(tval, fit.df),
        p_worse=t_sf(tval, fit.df),
        ci=(diff - half, diff + half),
    )


def run_spread(values: Sequence[float] | np.ndarray) -> float | None:
    """One config's spread between whole runs: the standard deviation of its repeats' log values.

    None below two finite positive values (one repeat has no spread to show).
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size < 2:
        return None
    return float(np.log(v).std(ddof=1))


def pair_spread(
    candidate: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray
) -> float | None:
    """The run spread shown by an A/A pair (a cell identical to B0): SD of the per-round log
    differences over sqrt(2), each run's own share. None below two rounds with both known."""
    c = np.asarray(candidate, dtype=float)
    b = np.asarray(baseline, dtype=float)
    ok = np.isfinite(c) & np.isfinite(b) & (c > 0) & (b > 0)
    if int(ok.sum()) < 2:
        return None
    return float((np.log(c[ok]) - np.log(b[ok])).std(ddof=1) / math.sqrt(2))


def rounds_detectable(
    sd: float, *, rounds: int, df: int, alpha: float, family: int, power: float = POWER
) -> float:
    """Smallest true change (on the log scale) the run-level test finds with ``power``.

    (t(1 - alpha/m, df) + t(power, df)) x sqrt(2 sd^2 / R): the strictest Holm step, Student's t
    with the fit's degrees of freedom. inf where no spread can be estimated.
    """
    if not math.isfinite(sd) or rounds < 2 or df < 1:
        return math.inf
    crit = t_ppf(1 - alpha / max(1, family), df) + t_ppf(power, df)
    return crit * math.sqrt(2 * sd * sd / rounds)


def repeats_needed(
    sd: float,
    change_rel: float,
    *,
    cells: int,
    alpha: float,
    family: int,
    power: float = POWER,
    most: int = 200,
) -> int | None:
    """Fewest repeat rounds with which the run-level test finds a change of ``change_rel``
    (0.4 = 40% lower or higher) of a metric whose runs spread by ``sd`` (log scale), at the
    strictest Holm step, with ``cells`` cells in the pool. None when even ``most`` rounds do not.
    """
    if not math.isfinite(sd) or not 0 < change_rel < 1:
        return None
    target = abs(math.log(1 - change_rel))
    for r in range(2, most + 1):
        df = max(1, (max(2, cells) - 1) * (r - 1))
        if rounds_detectable(sd, rounds=r, df=df, alpha=alpha, family=family, power=power) <= target:
            return r
    return None
