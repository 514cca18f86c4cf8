"""Synthetic experiments whose records carry vLLM's per-request timings (the spans' join), for the
TTFT split and the diagnosis tests. No database."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from apps.analysis.columns import RecordTable
from apps.analysis.report import build_report
from tests.analysis.builders import MS, Behaviour, Plan, build_inputs
from workers.replay.records import RequestRecord

# (cell, run key, record) -> (queue ms, prefill ms, front end ms), or None: no span joined.
Split = Callable[[str, str, RequestRecord], tuple[float, float, float] | None]


def usable(share: float = 1.0) -> dict[str, Any]:
    """A run summary's ``server_spans`` for spans that joined ``share`` of its requests."""
    used = share >= 0.95
    return {
        "source": "otlp",
        "received": 100,
        "joined": round(100 * share),
        "answered": 100,
        "share": share,
        "min_share": 0.95,
        "used": used,
        "reason": "" if used else "too few spans joined",
    }


def attach(record: RequestRecord, queue_ms: float, prefill_ms: float, front_ms: float) -> None:
    """Give a record the span timings of a request that spent these times in vLLM (its TTFT from
    arrival is their sum; the rest of the client's TTFT is the network's)."""
    decode = (
        record.last_token_ns - record.first_token_ns
        if record.first_token_ns is not None and record.last_token_ns is not None
        else None
    )
    timings = {
        "server_queue_ns": round(queue_ms * MS),
        "server_prefill_ns": round(prefill_ms * MS),
        "server_ttft_ns": round((queue_ms + prefill_ms + front_ms) * MS),
        "server_decode_ns": decode,
        "server_e2e_ns": None,
    }
    # By name: the fields are RequestRecord's once the spans' join is in (columns.SERVER_FIELDS);
    # a record without them reads as not joined, so this sets them either way.
    for name, value in timings.items():
        setattr(record, name, value)


def build_with_spans(
    plan: Plan,
    behaviour: Behaviour,
    split: Split,
    *,
    spans: Callable[[Mapping[str, Any]], dict[str, Any] | None] = lambda run: usable(),
    samples: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
    run_overrides: Callable[[dict[str, Any]], None] | None = None,
    experiment: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """build_report over the plan, each record's span from ``split``, each run's ``server_spans``
    from ``spans`` (None: the run recorded none)."""
    inputs = build_inputs(plan, behaviour, samples=samples, run_overrides=run_overrides)
    records: list[RequestRecord] = inputs.pop("records")
    cell_of = {r["key"]: r["cell"] for r in inputs["runs"]}
    for rec in records:
        parts = split(cell_of[rec.run_id], rec.run_id, rec)
        if parts is not None and rec.first_token_ns is not None:
            attach(rec, *parts)
    for run in inputs["runs"]:
        summary = spans(run)
        if summary is not None:
            run["server_spans"] = summary
    if experiment:
        inputs["experiment"] = {**inputs["experiment"], **experiment}
    return build_report(**inputs, table=RecordTable.from_records(records), options=options)


def row_of(
    report: Mapping[str, Any], cell: str, cls: str, mixture: str = "mix", rate: str = "r1"
) -> dict[str, Any]:
    return next(
        r
        for r in report["ttft_parts"]["rows"]
        if (r["cell"], r["class"], r["mixture"], r["rate"]) == (cell, cls, mixture, rate)
    )
