"""What the paired comparison (apps/analysis/compare.py) compares, and its options. Pure.

The metrics: each per-request tail (TTFT, end-to-end, max stall) at p99, or p95 where the
requests are too few for a p99, goodput, the contract share and the inter-token latency p99,
and which way is better. The options (``analysis.compare`` in the spec): how many draws, the
seed, the confidence, what counts as a material difference, the family-wise error rate, the
non-inferiority margin, the contract test's level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.analysis.report_types import CompareOptionsJSON

# Tail metrics per request: kind -> the Derived fields of its value and lower bound.
LATENCY_KINDS: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_ms", "ttft_bound_ms"),
    "e2e": ("e2e_ms", "e2e_bound_ms"),
    "max_stall": ("stall_ms", "stall_bound_ms"),
}
LEVELS = ("p99", "p95")


def latency_metric(kind: str, level: str) -> str:
    return f"{kind}_{level}_ms"


def metric_kind(metric: str) -> str | None:
    """'e2e_p95_ms' -> 'e2e'; None for a metric that is not a per-request tail."""
    for kind in LATENCY_KINDS:
        if metric.startswith(kind + "_p"):
            return kind
    return None


# metric -> True when higher is better.
HIGHER_IS_BETTER: dict[str, bool] = {
    "goodput_rps": True,
    "contract_share": True,
    **{latency_metric(k, lv): False for lv in LEVELS for k in LATENCY_KINDS},
    "itl_p99_ms": False,
}
PRIMARY_CHOICES = tuple(latency_metric(k, "p99") for k in LATENCY_KINDS)


def _default_abs() -> dict[str, float]:
    out = {"goodput_rps": 0.01, "contract_share": 0.01, "itl_p99_ms": 1.0}
    out.update({latency_metric(k, lv): 5.0 for lv in LEVELS for k in LATENCY_KINDS})
    return out


OPTION_KEYS = frozenset(
    {
        "resamples",
        "seed",
        "confidence",
        "min_effect_rel",
        "min_effect_abs",
        "family_alpha",
        "noninferiority_margin_rel",
        "contract_alpha",
        "itl_min_repeats",
        "seed_check",
    }
)
MIN_RESAMPLES = 2000


@dataclass(frozen=True)
class CompareOptions:
    # Bootstrap draws: at least this many, more as the gain family grows (inference.family_resamples).
    resamples: int = MIN_RESAMPLES
    seed: int = 0
    # The interval shown and the "materially worse" guard (two-sided, uncorrected).
    confidence: float = 0.95
    # A difference is material only when it is larger than both of these
    # (relative to B0's value, and absolute) as well as significant.
    min_effect_rel: float = 0.05
    min_effect_abs: Mapping[str, float] = field(default_factory=_default_abs)
    # Family-wise error rate of the gains a retune rests on (Holm).
    family_alpha: float = 0.05
    # Non-inferiority: the interval's upper end of every class's primary metric
    # must stay below B0 x (1 + this).
    noninferiority_margin_rel: float = 0.25
    # Exact binomial test of a contract limit: broken when the share over it is above
    # the allowed share with confidence 1 - this.
    contract_alpha: float = 0.05
    # Inter-token latency is resampled by repeat only: below this many repeats it is never material.
    itl_min_repeats: int = 5
    # Repeat the comparison under a second seed and mark what changes "borderline".
    seed_check: bool = True

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> CompareOptions:
        data = dict(data or {})
        unknown = set(data) - OPTION_KEYS
        if unknown:
            raise ValueError(f"unknown comparison options: {', '.join(sorted(unknown))}")
        abs_ = _default_abs()
        given = dict(data.pop("min_effect_abs", {}) or {})
        for k, v in given.items():
            if k not in abs_:
                raise ValueError(f"min_effect_abs: unknown metric {k!r}")
            abs_[k] = float(v)
        # A p95 fallback takes its p99's minimum effect unless it is given itself.
        for k, v in given.items():
            twin = k.replace("_p99_", "_p95_")
            if k.endswith("_p99_ms") and twin in abs_ and twin not in given:
                abs_[twin] = float(v)
        opts = cls(min_effect_abs=abs_, **data)
        if opts.resamples < MIN_RESAMPLES:
            raise ValueError(f"resamples must be at least {MIN_RESAMPLES}")
        if not 0.5 < opts.confidence < 1:
            raise ValueError("confidence must be in (0.5, 1)")
        for name in ("family_alpha", "contract_alpha"):
            if not 0 < getattr(opts, name) < 0.5:
                raise ValueError(f"{name} must be in (0, 0.5)")
        if not 0 < opts.noninferiority_margin_rel <= 1:
            raise ValueError("noninferiority_margin_rel must be in (0, 1]")
        if opts.itl_min_repeats < 2:
            raise ValueError("itl_min_repeats must be at least 2")
        return opts

    def to_json(self) -> CompareOptionsJSON:
        return {
            "resamples": self.resamples,
            "seed": self.seed,
            "confidence": self.confidence,
            "min_effect_rel": self.min_effect_rel,
            "min_effect_abs": dict(self.min_effect_abs),
            "family_alpha": self.family_alpha,
            "noninferiority_margin_rel": self.noninferiority_margin_rel,
            "contract_alpha": self.contract_alpha,
            "itl_min_repeats": self.itl_min_repeats,
            "seed_check": self.seed_check,
        }
