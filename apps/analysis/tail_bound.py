"""What bounds each class's tail: queue (scheduling), prefill or decode, with the evidence, and the
knobs the decision table points at for that bound. Pure.

``diagnose`` is the rule table, on plain evidence (``BoundEvidence``), so the table is tested
row by row; ``tail_bounds`` gathers the evidence of every class at every agreed (mixture, rate)
of every valid cell from the report's parts:

1. The tail: the class's primary metric's latency (family.primary_metrics): TTFT for the short
   class, end-to-end for the long one, unless the spec says otherwise; max stall when declared.
2. Its shares, from ONE request's own parts (apps/analysis/ttft_parts.py): the p99 TTFT request's
   queue, prefill and the rest outside the engine (front end, network, send delay); for an
   end-to-end tail the p99 end-to-end request's decode (first to last token, as the client saw it)
   and its TTFT's parts. Per run (vLLM's histograms) where no span joined, said so.
3. The bound: the largest of queue, prefill and decode, when the engine's parts make at least
   ``ENGINE_SHARE`` of the tail; otherwise "outside the engine" (no scheduler knob helps); a stall
   tail is prefill-bound next to longer prompts (a long prefill shares the step the stream waits
   on) and decode-bound without them.
4. The cause behind a queue: a full KV cache or preemptions, the sequence limit reached, waiting
   behind longer prompts' prefills, else the scheduling order itself; each has its knobs (KNOBS).
5. The evidence beside it: the /metrics gauges over the point's runs (running, waiting, KV use,
   preemptions) and inter-token latency against the running batch over the cell's runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.analysis.family import primary_metrics
from apps.analysis.metrics import pvalue
from apps.analysis.report_types import Aggregate, RunResult, TailBound, TtftPartsRow

# The engine's parts (queue, prefill, decode) must make at least this share of the tail for the
# bound to be one of them; below it the time went outside the engine.
ENGINE_SHARE = 0.5
# KV cache use (0-1) at or above which a queue is put down to a full cache.
KV_FULL = 0.95
# Inter-token latency "grows with the batch" when the fit over the cell's runs has a positive slope
# and a correlation of at least this, over at least ITL_MIN_RUNS runs.
ITL_BATCH_R = 0.5
ITL_MIN_RUNS = 3

# What the decision table points at for each bound and cause: vLLM's flags (or the remedy) to try.
KNOBS: dict[tuple[str, str], list[str]] = {
    ("queue", "kv cache pressure"): ["kv_cache_memory_bytes", "gpu_memory_utilization", "max_num_seqs"],
    ("queue", "sequence limit"): ["max_num_seqs", "capacity (replicas)"],
    ("queue", "behind longer prefills"): [
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "scheduling_policy",
        "isolation (a pool per class)",
    ],
    ("queue", "scheduling order"): [
        "scheduling_policy",
        "max_num_queued_reqs (bounded ingress)",
        "isolation (a pool per class)",
    ],
    ("prefill", "long prefill"): [
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "long_prefill_token_threshold",
    ],
    ("prefill", "long-prefill stall"): [
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
    ],
    ("decode", "batch"): ["max_num_seqs", "kv_cache_memory_bytes", "gpu_memory_utilization"],
    ("outside the engine", "client, network or front end"): [],
    ("unknown", "no split"): [],
}


@dataclass(frozen=True)
class BoundEvidence:
    """What ``diagnose`` reads of one class's tail at one point (every value may be unknown)."""

    tail: str  # "ttft" | "e2e" | "stall"
    tail_ms: float | None = None
    # The tail request's parts in ms (ttft_parts.COMPONENT_KEYS), and for an e2e tail its decode.
    parts: Mapping[str, float | None] | None = None
    decode_ms: float | None = None
    ttft_ms: float | None = None  # an end-to-end tail's request's TTFT
    after_ms: float | None = None  # an end-to-end tail's request: last token to the stream's end
    per_request: bool = True
    source: str = "spans"  # the TTFT split's: "spans" | "histograms" | "none"
    next_to_longer: bool = False  # a class with longer prompts had traffic at the same point
    stall_p99_ms: float | None = None
    stall_limit_ms: float | None = None  # the class's max-stall contract
    itl_p99_ms: float | None = None
    running_max: float | None = None
    waiting_max: float | None = None
    kv_max: float | None = None  # 0-1
    preemptions: float | None = None
    max_num_seqs: int | None = None
    itl_vs_batch: Mapping[str, Any] = field(default_factory=dict)


def _share(part: float | None, total: float | None) -> float | None:
    if part is None or total is None or total <= 0 or not math.isfinite(total):
        return None
    return round(part / total, 4)


def shares(ev: BoundEvidence) -> dict[str, float | None]:
    """Each part of the tail as a share of it: queue, prefill, decode, the rest outside the engine
    (front end, network, send delay, and after the last token), the whole TTFT of an end-to-end
    tail, and, per run without a prefill histogram, prefill-or-front-end."""
    p = ev.parts or {}
    total = ev.tail_ms
    outside_keys = ("front_end_ms", "network_ms", "send_delay_ms")
    outside: list[float] = [float(v) for k in outside_keys if (v := p.get(k)) is not None]
    if ev.tail == "e2e" and ev.parts and ev.after_ms is not None:
        outside.append(ev.after_ms)
    return {
        "queue": _share(p.get("queue_ms"), total),
        "prefill": _share(p.get("prefill_ms"), total),
        "prefill_or_front_end": _share(p.get("server_rest_ms"), total),
        "decode": _share(ev.decode_ms, total) if ev.tail == "e2e" else None,
        "ttft": _share(ev.ttft_ms, total) if ev.tail == "e2e" else None,
        "outside": _share(sum(outside), total) if outside else None,
    }


def _queue_cause(ev: BoundEvidence) -> str:
    if (ev.kv_max is not None and ev.kv_max >= KV_FULL) or (ev.preemptions or 0) > 0:
        return "kv cache pressure"
    if ev.max_num_seqs is not None and ev.running_max is not None and ev.running_max >= ev.max_num_seqs:
        return "sequence limit"
    if ev.next_to_longer:
        return "behind longer prefills"
    return "scheduling order"


def _itl_grows(ev: BoundEvidence) -> bool:
    fit = ev.itl_vs_batch
    return (
        int(fit.get("runs") or 0) >= ITL_MIN_RUNS
        and (fit.get("slope_ms_per_seq") or 0) > 0
        and (fit.get("r") or 0) >= ITL_BATCH_R
    )


def diagnose(ev: BoundEvidence) -> tuple[str, str, list[str]]:
    """The rule table: (bound, cause, knobs) for one class's tail (steps 3-4 of the module)."""
    if ev.tail == "stall":
        if ev.stall_p99_ms is None:
            return "unknown", "no split", KNOBS[("unknown", "no split")]
        if ev.next_to_longer:
            return "prefill", "long-prefill stall", KNOBS[("prefill", "long-prefill stall")]
        return "decode", "batch", KNOBS[("decode", "batch")]
    sh = shares(ev)
    engine = {
        "queue": sh["queue"],
        "prefill": sh["prefill"] if sh["prefill"] is not None else sh["prefill_or_front_end"],
        "decode": sh["decode"],
    }
    known = {k: v for k, v in engine.items() if v is not None}
    if ev.tail == "e2e" and not ev.parts:
        # The request's TTFT is not split (no joined span): only its decode can name a bound.
        if (sh["decode"] or 0) >= ENGINE_SHARE:
            return "decode", "batch", KNOBS[("decode", "batch")]
        return "unknown", "no split", KNOBS[("unknown", "no split")]
    if not known:
        return "unknown", "no split", KNOBS[("unknown", "no split")]
    if sum(known.values()) < ENGINE_SHARE:
        return (
            "outside the engine",
            "client, network or front end",
            KNOBS[("outside the engine", "client, network or front end")],
        )
    # The largest; on a tie the earlier in queue, prefill, decode (the earlier a part, the more of
    # the later ones it holds up).
    bound = max(known, key=lambda k: (known[k], -("queue", "prefill", "decode").index(k)))
    if bound == "queue":
        cause = _queue_cause(ev)
    elif bound == "prefill":
        cause = "long prefill"
    else:
        cause = "batch"
    return bound, cause, KNOBS[(bound, cause)]


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v * 100:.0f}%"


def why(ev: BoundEvidence, bound: str, cause: str, knobs: Sequence[str]) -> str:
    """The diagnosis in one sentence, with its numbers."""
    sh = shares(ev)
    tail = {"ttft": "TTFT", "e2e": "end-to-end", "stall": "max stall"}[ev.tail]
    if ev.tail == "stall":
        head = f"max stall p99 {ev.stall_p99_ms} ms against inter-token p99 {ev.itl_p99_ms} ms"
    else:
        split = ", ".join(
            f"{name} {_pct(sh[key])}"
            for key, name in (
                ("queue", "queue"),
                ("prefill", "prefill"),
                ("prefill_or_front_end", "prefill or front end"),
                ("decode", "decode"),
                ("ttft", "to first token"),
                ("outside", "outside the engine"),
            )
            if sh[key] is not None
        )
        where = {
            "spans": "its p99 request",
            "histograms": "per run (vLLM's histograms), not per request",
        }.get(ev.source, "its p99 request, TTFT not split (no span, no histogram)")
        if ev.tail == "e2e":
            where = "its p99 request" + ("" if ev.parts else ", its TTFT not split (no joined span)")
        head = f"{tail} p99 {ev.tail_ms} ms; {where}: {split or 'no split'}"
    seen = [
        f"{name} {value}"
        for name, value in (
            (
                "running max",
                f"{ev.running_max:g}" + (f" of {ev.max_num_seqs}" if ev.max_num_seqs else "")
                if ev.running_max is not None
                else None,
            ),
            ("waiting max", f"{ev.waiting_max:g}" if ev.waiting_max is not None else None),
            ("KV max", _pct(ev.kv_max) if ev.kv_max is not None else None),
            ("preemptions", f"{ev.preemptions:g}" if ev.preemptions is not None else None),
        )
        if value is not None
    ]
    gauges = f" ({', '.join(seen)})" if seen else " (no /metrics gauges)"
    label = f"{bound}-bound" if bound in ("queue", "prefill", "decode") else bound
    text = f"{head}{gauges}: {label}"
    if cause and bound != "unknown":
        text += f" ({cause})"
    if bound == "decode" and ev.itl_vs_batch:
        text += (
            "; inter-token latency "
            + ("grows" if _itl_grows(ev) else "does not clearly grow")
            + " with the batch"
        )
    text += f"; knobs: {', '.join(knobs)}" if knobs else ""
    if long_prefill_stall(ev):
        text += (
            f"; its streams also stall behind longer prefills: max stall p99 {ev.stall_p99_ms} ms over its "
            f"{ev.stall_limit_ms:g} ms limit (knobs: {', '.join(KNOBS[('prefill', 'long-prefill stall')])})"
        )
    return text


def long_prefill_stall(ev: BoundEvidence) -> bool:
    """A TTFT or end-to-end tail whose streams also break their stall limit next to longer prompts:
    the long-prefill stall decodes suffer, surfaced beside the tail's own bound."""
    return (
        ev.tail != "stall"
        and ev.next_to_longer
        and ev.stall_p99_ms is not None
        and ev.stall_limit_ms is not None
        and ev.stall_p99_ms > ev.stall_limit_ms
    )


def itl_vs_batch(runs: Sequence[RunResult], cell: str, name: str) -> dict[str, Any]:
    """Inter-token latency p50 of the class against the mean running batch, over the cell's done
    sweep runs (every mixture and rate): the least-squares slope (ms per running sequence) and the
    correlation; fewer than two distinct batch sizes fit nothing."""
    pairs = [
        (float(r["server"]["gauges"]["running"]["mean"]), float(r["classes"][name]["itl_ms"]["p50"]))
        for r in runs
        if r["cell"] == cell
        and r["status"] == "done"
        and not r["scenario"]
        and (r["server"].get("gauges", {}).get("running") or {}).get("mean") is not None
        and name in r["classes"]
        and r["classes"][name]["itl_ms"]["p50"] is not None
    ]
    out: dict[str, Any] = {"runs": len(pairs), "slope_ms_per_seq": None, "r": None}
    xs = np.asarray([p[0] for p in pairs])
    ys = np.asarray([p[1] for p in pairs])
    if len(pairs) >= 2 and float(np.ptp(xs)) > 0:
        slope = float(np.polyfit(xs, ys, 1)[0])
        out["slope_ms_per_seq"] = round(slope, 4)
        if float(np.ptp(ys)) > 0:
            out["r"] = round(float(np.corrcoef(xs, ys)[0, 1]), 4)
    return out


def _point_gauges(runs: Sequence[RunResult]) -> dict[str, float | None]:
    def biggest(key: str) -> float | None:
        vals = [(r["server"].get("gauges", {}).get(key) or {}).get("max") for r in runs]
        known = [float(v) for v in vals if v is not None]
        return max(known) if known else None

    pre = [(r["server"].get("counters") or {}).get("preemptions") for r in runs]
    known_pre = [float(p) for p in pre if p is not None]
    return {
        "running_max": biggest("running"),
        "waiting_max": biggest("waiting"),
        "kv_max": biggest("kv_usage"),
        "preemptions": sum(known_pre) if known_pre else None,
    }


def _max_num_seqs(cell: Mapping[str, Any], runs: Sequence[RunResult]) -> int | None:
    """The cell's sequence limit: its arguments', else what its runs' servers ran with."""
    value = (cell.get("args") or {}).get("max_num_seqs")
    if value is None:
        value = next(
            (
                (r.get("effective_args") or {}).get("max_num_seqs")
                for r in runs
                if isinstance(r.get("effective_args"), Mapping)
                and (r.get("effective_args") or {}).get("max_num_seqs") is not None
            ),
            None,
        )
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def tail_bounds(
    *,
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    agreed: Sequence[tuple[str, str, int]],
    parts_rows: Sequence[TtftPartsRow],
    aggregates: Sequence[Aggregate],
    run_results: Sequence[RunResult],
    invalid_cells: Sequence[str] = (),
) -> list[TailBound]:
    """Every class's diagnosis at every agreed (mixture, rate) of every valid cell, in plan order."""
    primary = primary_metrics(classes)
    tokens = {c["name"]: int(c.get("input_tokens", 0) or 0) for c in classes}
    points = sorted({(m, r) for m, r, _ in agreed})
    parts = {(p["cell"], p["mixture"], p["rate"], p["class"]): p for p in parts_rows}
    agg = {(a["cell"], a["mixture"], a["rate"], a["class"]): a["pooled"] for a in aggregates}
    out: list[TailBound] = []
    for cell in cells:
        cid = str(cell["cell_id"])
        if cid in invalid_cells:
            continue
        for mixture, rate in points:
            runs = [
                r
                for r in run_results
                if r["cell"] == cid
                and r["mixture"] == mixture
                and r["rate"] == rate
                and r["status"] == "done"
                and not r["scenario"]
            ]
            gauges = _point_gauges(runs)
            for c in classes:
                name = str(c["name"])
                m = agg.get((cid, mixture, rate, name))
                row = parts.get((cid, mixture, rate, name))
                if m is None or m["counts"]["offered"] == 0:
                    continue
                ev = _evidence(
                    primary.get(name, "ttft_p99_ms"),
                    c.get("max_stall_ms"),
                    m,
                    row,
                    next_to_longer=any(
                        tokens[o] > tokens[name]
                        and (agg.get((cid, mixture, rate, o)) or {"counts": {"offered": 0}})["counts"][
                            "offered"
                        ]
                        > 0
                        for o in tokens
                    ),
                    gauges=gauges,
                    max_num_seqs=_max_num_seqs(cell, runs),
                    itl_fit=itl_vs_batch(run_results, cid, name),
                )
                bound, cause, knobs = diagnose(ev)
                out.append(
                    {
                        "cell": cid,
                        "mixture": mixture,
                        "rate": rate,
                        "class": name,
                        "tail": ev.tail,
                        "bound": bound,
                        "cause": cause,
                        "per_request": ev.per_request,
                        "shares": shares(ev),
                        "evidence": {
                            "tail_ms": ev.tail_ms,
                            "parts_ms": dict(ev.parts) if ev.parts else None,
                            "decode_ms": ev.decode_ms,
                            "stall_p99_ms": ev.stall_p99_ms,
                            "stall_limit_ms": ev.stall_limit_ms,
                            "long_prefill_stall": long_prefill_stall(ev),
                            "itl_p99_ms": ev.itl_p99_ms,
                            "next_to_longer_prompts": ev.next_to_longer,
                            **gauges,
                            "max_num_seqs": ev.max_num_seqs,
                            "itl_vs_batch": dict(ev.itl_vs_batch),
                            "source": row["source"] if row else "none",
                        },
                        "knobs": knobs,
                        "why": why(ev, bound, cause, knobs),
                    }
                )
    return out


def _evidence(
    primary: str,
    stall_limit: float | None,
    m: Mapping[str, Any],
    row: TtftPartsRow | None,
    *,
    next_to_longer: bool,
    gauges: Mapping[str, float | None],
    max_num_seqs: int | None,
    itl_fit: Mapping[str, Any],
) -> BoundEvidence:
    """One class's evidence at one point (steps 1-2 and 5)."""
    tail = "e2e" if primary.startswith("e2e") else "stall" if primary.startswith("max_stall") else "ttft"
    stall = pvalue(m["max_stall_ms"]["p99"])
    common: dict[str, Any] = {
        "next_to_longer": next_to_longer,
        "stall_p99_ms": stall if math.isfinite(stall) else None,
        "stall_limit_ms": float(stall_limit) if stall_limit is not None else None,
        "itl_p99_ms": m["itl_ms"]["p99"],
        "max_num_seqs": max_num_seqs,
        "itl_vs_batch": itl_fit,
        **gauges,
    }
    per_request = bool(row and row["per_request"])
    common["source"] = row["source"] if row else "none"
    if tail == "e2e":
        e2e: Mapping[str, Any] = (row["e2e_p99"] if row else None) or {}
        return BoundEvidence(
            tail="e2e",
            tail_ms=e2e.get("e2e_ms"),
            parts=e2e.get("parts"),
            decode_ms=e2e.get("decode_ms"),
            ttft_ms=e2e.get("ttft_ms"),
            after_ms=e2e.get("after_last_token_ms"),
            per_request=True,  # the decode share is the request's own, from the client's clock
            **common,
        )
    at: Mapping[str, Any] = {} if row is None else row["p99"]
    # The parts add up to the split request's own TTFT (the p99 request, or its nearest joined one).
    total = at.get("request_ttft_ms") if at.get("request_ttft_ms") is not None else at.get("ttft_ms")
    return BoundEvidence(tail=tail, tail_ms=total, parts=at.get("parts"), per_request=per_request, **common)
