"""Two experiments' cells (or two cells of one) side by side on the metrics they share. Pure.

1. Each side is one cell's pooled class metrics per (mixture, rate, class) from its experiment's
   stored report, with what its runs were measured on: the trace of each point, the hardware,
   the model and tokenizer revisions.
2. They are compared only when they were measured alike: the same traces at every point they
   share, the same hardware class, the same model and tokenizer revisions. Otherwise
   NotComparable lists every reason, and nothing is compared: two numbers from different
   traffic or machines differ for reasons the table could not show.
3. The rows: every shared point and class, every metric both sides have a value for, with the
   difference and the relative change. Two experiments' runs are not paired, so there is no
   interval here: for a judged difference run both cells in one experiment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from apps.history.pooled import COMPARED, value

Point = tuple[str, str]  # (mixture, rate)


class NotComparable(Exception):
    def __init__(self, reasons: Sequence[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = list(reasons)


@dataclass(frozen=True)
class Side:
    experiment_id: int
    name: str
    cell: str
    model_revision: str
    tokenizer_revision: str
    hardware: frozenset[str]
    traces: Mapping[Point, frozenset[str]]
    metrics: Mapping[tuple[str, str, str], Mapping[str, float | None]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"#{self.experiment_id} {self.cell}"


class Row(TypedDict):
    mixture: str
    rate: str
    request_class: str
    metric: str
    a: float
    b: float
    diff: float
    rel: float | None


def side_from_report(
    *,
    experiment_id: int,
    name: str,
    cell: str,
    report: Mapping[str, Any],
    runs: Iterable[Mapping[str, Any]],
    model_revision: str,
    tokenizer_revision: str,
    hardware_id: str,
) -> Side:
    traces: dict[Point, set[str]] = {}
    hardware: set[str] = set()
    for run in runs:
        point = (str(run.get("mixture")), str(run.get("rate")))
        traces.setdefault(point, set()).add(str(run.get("trace_sha256") or ""))
        if run.get("hardware_id"):
            hardware.add(str(run["hardware_id"]))
    metrics: dict[tuple[str, str, str], dict[str, float | None]] = {}
    for agg in report.get("aggregates") or []:
        if agg.get("cell") != cell:
            continue
        key = (str(agg.get("mixture")), str(agg.get("rate")), str(agg.get("class")))
        metrics[key] = {m: value(agg.get("pooled") or {}, m) for m in COMPARED}
    return Side(
        experiment_id=experiment_id,
        name=name,
        cell=cell,
        model_revision=model_revision,
        tokenizer_revision=tokenizer_revision,
        hardware=frozenset(hardware or ({hardware_id} if hardware_id else set())),
        traces={p: frozenset(t) for p, t in traces.items()},
        metrics=metrics,
    )


def _short(hashes: frozenset[str]) -> str:
    return ", ".join(h[:12] for h in sorted(hashes)) or "none"


def refusals(a: Side, b: Side) -> list[str]:
    """Why the two sides cannot be compared; empty when they can."""
    out: list[str] = []
    shared = sorted(set(a.traces) & set(b.traces))
    if not shared:
        out.append(
            f"they share no (mixture, rate): {a.label} has {sorted(a.traces) or 'no done run'}, "
            f"{b.label} has {sorted(b.traces) or 'no done run'}"
        )
    for mixture, rate in shared:
        ta, tb = a.traces[(mixture, rate)], b.traces[(mixture, rate)]
        if ta != tb:
            out.append(
                f"different traces at {mixture} @ {rate}: {a.label} replayed {_short(ta)}, "
                f"{b.label} replayed {_short(tb)}"
            )
    if a.hardware != b.hardware:
        out.append(
            f"different hardware: {a.label} ran on {', '.join(sorted(a.hardware)) or 'unknown'}, "
            f"{b.label} on {', '.join(sorted(b.hardware)) or 'unknown'}"
        )
    if a.model_revision != b.model_revision:
        out.append(f"different model revisions: {a.model_revision!r} and {b.model_revision!r}")
    if a.tokenizer_revision != b.tokenizer_revision:
        out.append(f"different tokenizer revisions: {a.tokenizer_revision!r} and {b.tokenizer_revision!r}")
    return out


def compare(a: Side, b: Side) -> list[Row]:
    """The rows both sides have a value for; raises NotComparable with every reason first."""
    reasons = refusals(a, b)
    if reasons:
        raise NotComparable(reasons)
    rows: list[Row] = []
    for key in sorted(set(a.metrics) & set(b.metrics)):
        mixture, rate, cls = key
        for metric in COMPARED:
            va, vb = a.metrics[key].get(metric), b.metrics[key].get(metric)
            if va is None or vb is None:
                continue
            rows.append(
                {
                    "mixture": mixture,
                    "rate": rate,
                    "request_class": cls,
                    "metric": metric,
                    "a": va,
                    "b": vb,
                    "diff": vb - va,
                    "rel": (vb - va) / va if va else None,
                }
            )
    if not rows:
        raise NotComparable(
            [f"{a.label} and {b.label} share no class with a measured value at the same point"]
        )
    return rows
