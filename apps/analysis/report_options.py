"""The report's options (a spec's ``analysis`` block) and the (mixture, rate, repeat) points
they judge. Pure; the report itself is apps/analysis/report.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.analysis import cost, pool_sizing, rejections
from apps.analysis.compare_options import CompareOptions
from apps.analysis.report_types import ReportOptionsJSON


@dataclass(frozen=True)
class ReportOptions:
    compare: CompareOptions = field(default_factory=CompareOptions)
    # The rates (names) at which acceptance and the decision are judged; None: every rate.
    agreed_rates: tuple[str, ...] | None = None
    # Short-class max-stall growth next to long traffic that counts as a stall finding.
    stall_ratio: float = 2.0
    # Preemptions over requests above which a candidate is rejected (apps/analysis/rejections.py).
    max_preemption_share: float = rejections.MAX_PREEMPTION_SHARE
    # Price of one GPU-hour for the cost per 1M output tokens (else the host's, apps/analysis/cost.py).
    usd_per_gpu_hour: float | None = None
    # The share of each replica's measured capacity an isolate decision's pools leave unused
    # (apps/analysis/pool_sizing.py).
    pool_headroom: float = pool_sizing.DEFAULT_HEADROOM

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> ReportOptions:
        data = dict(data or {})
        unknown = set(data) - {
            "compare",
            "agreed_rates",
            "stall_ratio",
            "max_preemption_share",
            "usd_per_gpu_hour",
            "pool_headroom",
        }
        if unknown:
            raise ValueError(f"unknown analysis options: {', '.join(sorted(unknown))}")
        agreed = data.get("agreed_rates")
        return cls(
            compare=CompareOptions.from_mapping(data.get("compare")),
            agreed_rates=tuple(str(r) for r in agreed) if agreed is not None else None,
            stall_ratio=float(data.get("stall_ratio", 2.0)),
            max_preemption_share=_share(data.get("max_preemption_share", rejections.MAX_PREEMPTION_SHARE)),
            usd_per_gpu_hour=_price(data.get("usd_per_gpu_hour")),
            pool_headroom=pool_sizing.checked_headroom(
                data.get("pool_headroom", pool_sizing.DEFAULT_HEADROOM)
            ),
        )

    def to_json(self) -> ReportOptionsJSON:
        return {
            "compare": self.compare.to_json(),
            "agreed_rates": list(self.agreed_rates) if self.agreed_rates is not None else None,
            "stall_ratio": self.stall_ratio,
            "max_preemption_share": self.max_preemption_share,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "pool_headroom": self.pool_headroom,
        }


def _share(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"max_preemption_share must be a number from 0 to 1, got {value!r:.40}")
    return float(value)


def _price(value: Any) -> float | None:
    if value is None:
        return None
    if not cost.valid_price(value):
        raise ValueError(f"usd_per_gpu_hour must be a positive number of dollars, got {value!r:.40}")
    return float(value)


def sweep_combos(
    sweep: Sequence[Mapping[str, Any]], experiment: Mapping[str, Any]
) -> list[tuple[str, str, int]]:
    """The sweep's (mixture, rate, repeat) points, sorted: those its runs sit at, and every
    mixture x rate of the experiment at each of the runs' repeats (repeat 0 when none ran)."""
    combo_set = {(str(r["mixture"]), str(r["rate"]), int(r["repeat"])) for r in sweep}
    repeats = sorted({c[2] for c in combo_set})
    for mix in experiment.get("mixtures") or {}:
        for rate in experiment.get("rates") or {}:
            for rep in repeats or [0]:
                combo_set.add((mix, rate, rep))
    return sorted(combo_set)


def agreed_combos(combos: Sequence[tuple[str, str, int]], opts: ReportOptions) -> list[tuple[str, str, int]]:
    """The points acceptance and the decision are judged at: those at an agreed rate."""
    return [c for c in combos if opts.agreed_rates is None or c[1] in opts.agreed_rates]
