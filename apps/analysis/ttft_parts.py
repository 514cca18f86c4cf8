"""Where each class's time to first token goes: the client's TTFT split into the client's and the
server's parts, per (cell, mixture, rate, class). Pure (numpy only).

The client's TTFT is measured from the request's planned arrival, as every latency of the report
(apps/analysis/metrics.py), over the same cohort with the same censoring. vLLM's span of each
request, joined to its record by request id (the records' ``server_*_ns``, apps/analysis/columns.py
SERVER_FIELDS), splits it into five parts that add up to it (each rounded to a microsecond):

- ``queue_ms``: vLLM's time in its waiting queue (queued to first scheduled);
- ``prefill_ms``: first scheduled to first token: the prompt's forward passes and, with chunked
  prefill or a busy batch, the steps it shared with other requests while it was running;
- ``front_end_ms``: vLLM's own TTFT minus queue and prefill: the API server's work before the
  request reaches the engine's queue (tokenising, input processing, the hand-off) and the first
  token's way back to the API server;
- ``network_ms``: the client's TTFT from its send minus vLLM's TTFT: connection, HTTP, SSE framing,
  the client's read;
- ``send_delay_ms``: send minus planned arrival: the load generator's lateness and any client
  concurrency slot it waited for.

The algorithm, per (cell, mixture, rate, class):

1. The runs used: the point's done sweep runs (the ones its aggregate pools) whose summary says
   their spans are usable (``server_spans.used``: at least ``min_share`` of the run's requests
   joined, workers' side). A run without usable spans is listed with why, and left out.
2. Their cohort requests of the class, pooled. For q in (0.5, 0.99): the nearest rank k = ceil(q·n)
   over all of them, unobserved TTFTs ranking above every observed one (metrics.censored_percentile).
   The row at q is THAT request's own parts, never a sum of per-part percentiles: parts of
   different requests do not add up to anyone's TTFT. A request at rank k without a joined span
   is replaced by the nearest joined one in rank (ties: the slower), marked ``substitute``; a rank
   among the unobserved has no parts (``censored``: no first token, nothing to split).
3. The p99 end-to-end request too (the streams the client did not cancel): its TTFT, its decode as
   the client saw it (first to last token) and the rest to the stream's end, with its own TTFT
   parts when it joined: what apps/analysis/tail_bound.py reads for an end-to-end tail.
4. Where no run of the point has usable spans, the split falls back to vLLM's histograms scraped
   from /metrics (queue time, TTFT and, where scraped, prefill time; apps/analysis/server_metrics.py),
   pooled over the point's done runs: quantiles of every request the server finished in those runs
   (every class, warm-up included) beside the class's own client quantile. That split is per run,
   not per request (``per_request`` false): its parts are quantiles of different populations and
   need not add up, and ``network_ms`` there is the class's client TTFT minus every request's
   server TTFT (send delay included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from apps.analysis import metrics
from apps.analysis.columns import RecordTable
from apps.analysis.measured import Cohorts, Plan, SweepPoints
from apps.analysis.report_inputs import RunInput
from apps.analysis.report_types import JSONObject, PartsAt, RunResult, TtftParts, TtftPartsRow
from apps.analysis.server_metrics import histogram_quantile, merge_histograms

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p99", 0.99))
# The spans' contract (workers' side): a run whose spans joined less than this share of its
# requests says so and is not used. The per-run summary carries its own ``min_share``.
MIN_SHARE = 0.95
NS_PER_MS = metrics.NS_PER_MS

# Every part, bottom of the stacked bar first: key, label, what it is.
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("queue_ms", "queue", "waiting in vLLM's queue, from queued to first scheduled"),
    (
        "prefill_ms",
        "prefill",
        "first scheduled to first token: the prompt's forward passes and the steps shared with "
        "other requests meanwhile",
    ),
    (
        "front_end_ms",
        "server front end",
        "vLLM's TTFT minus queue and prefill: tokenising and hand-off in the API server before the "
        "engine's queue, and the first token's way back",
    ),
    (
        "server_rest_ms",
        "prefill and front end",
        "per run only, where vLLM's prefill histogram was not scraped: its TTFT minus its queue time",
    ),
    (
        "network_ms",
        "client, network and HTTP",
        "the client's TTFT from its send minus vLLM's TTFT (per run: the class's client TTFT minus "
        "every request's server TTFT, send delay included)",
    ),
    ("send_delay_ms", "sent late", "send minus planned arrival: the load generator's lateness"),
)
COMPONENT_KEYS = tuple(k for k, _, _ in COMPONENTS)


def _ms(v: float) -> float:
    return float(round(float(v) / NS_PER_MS, 3))


def spans_usable(run: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a run's spans may be used per request, and why not (the run's ``server_spans``)."""
    spans = run.get("server_spans")
    if not isinstance(spans, Mapping):
        return False, "no server spans recorded"
    if spans.get("used") is True:
        return True, ""
    if spans.get("source") == "none":
        return False, str(spans.get("reason") or "the engine exported no spans")
    share, need = spans.get("share"), spans.get("min_share", MIN_SHARE)
    if isinstance(share, (int, float)) and isinstance(need, (int, float)):
        why = f"spans joined {share:.1%} of its requests, under {need:.0%}"
        return False, f"{why}: {spans['reason']}" if spans.get("reason") else why
    return False, str(spans.get("reason") or "spans not usable")


def _joined(table: RecordTable) -> np.ndarray:
    """Rows whose span joined: queue, prefill and vLLM's TTFT all known, and the send time."""
    return (
        ~np.isnan(table.server("server_queue_ns"))
        & ~np.isnan(table.server("server_prefill_ns"))
        & ~np.isnan(table.server("server_ttft_ns"))
        & ~np.isnan(table.sent_ns)
    )


def request_parts(table: RecordTable, row: int) -> dict[str, float | None]:
    """One joined request's own parts (ms); they add up to its TTFT from the planned arrival."""
    queue = table.server("server_queue_ns")[row]
    prefill = table.server("server_prefill_ns")[row]
    server_ttft = table.server("server_ttft_ns")[row]
    sent, planned, first = table.sent_ns[row], table.planned_ns[row], table.first_token_ns[row]
    return {
        "queue_ms": _ms(queue),
        "prefill_ms": _ms(prefill),
        "front_end_ms": _ms(server_ttft - queue - prefill),
        "server_rest_ms": None,
        "network_ms": _ms(first - sent - server_ttft),
        "send_delay_ms": _ms(sent - planned),
    }


def _ranked(
    values: np.ndarray, bounds: np.ndarray, rows: np.ndarray, table: RecordTable, q: float
) -> tuple[np.ndarray, int, int, dict[str, Any]]:
    """The observed rows in rank order (value, then run, then index), the rank k = ceil(q·n), the
    count n, and the percentile as metrics reports it."""
    seen = ~np.isnan(values[rows])
    obs = rows[seen]
    order = np.lexsort((table.index[obs], table.run[obs], values[obs]))
    n = int(rows.size)
    k = max(1, math.ceil(q * n - 1e-9)) if n else 0
    pct = metrics.censored_percentile(values[obs], bounds[rows[~seen]], q)
    return obs[order], k, n, pct


def _nearest_joined(ranked: np.ndarray, pos: int, joined: np.ndarray) -> int | None:
    """Position of the joined request nearest to ``pos`` in rank (the slower one on a tie)."""
    ok = joined[ranked]
    if ok[pos]:
        return pos
    for step in range(1, ranked.size):
        for cand in (pos + step, pos - step):
            if 0 <= cand < ranked.size and ok[cand]:
                return cand
    return None


def _request_id(table: RecordTable, row: int) -> dict[str, Any]:
    return {"run": table.run_keys[int(table.run[row])], "index": int(table.index[row])}


def _at(
    q: float,
    note: str | None,
    *,
    pct: Mapping[str, Any] | None = None,
    rank: int | None = None,
    parts: dict[str, float | None] | None = None,
    request: dict[str, Any] | None = None,
    request_ttft_ms: float | None = None,
    rank_used: int | None = None,
) -> PartsAt:
    """A quantile's entry: the class's TTFT there (``pct``, a metrics percentile) and the parts of
    the request split (none without ``parts``)."""
    return {
        "q": q,
        "ttft_ms": (pct or {}).get("ms"),
        "censored": bool((pct or {}).get("censored")),
        "above_ms": (pct or {}).get("above_ms"),
        "parts": parts,
        "request": request,
        "request_ttft_ms": request_ttft_ms,
        "rank": rank,
        "rank_used": rank_used,
        "substitute": rank_used is not None and rank_used != rank,
        "note": note,
    }


def per_request_at(cohorts: Cohorts, rows: np.ndarray, joined: np.ndarray, q: float) -> PartsAt:
    """Step 2: the request at the class's q-th TTFT, with its own parts."""
    d, table = cohorts.d, cohorts.d.table
    ranked, k, n, pct = _ranked(d.ttft_ms, d.ttft_bound_ms, rows, table, q)
    if n == 0:
        return _at(q, "no request")
    if k > ranked.size:
        return _at(q, "the request at this rank got no first token: nothing to split", pct=pct, rank=k)
    pos = _nearest_joined(ranked, k - 1, joined)
    if pos is None:
        return _at(q, "no request of the class here has a joined span", pct=pct, rank=k)
    row = int(ranked[pos])
    note = (
        f"the request at rank {k} of {n} has no joined span: the nearest joined one, rank {pos + 1}"
        if pos != k - 1
        else None
    )
    return _at(
        q,
        note,
        pct=pct,
        rank=k,
        parts=request_parts(table, row),
        request=_request_id(table, row),
        request_ttft_ms=float(round(d.ttft_ms[row], 3)),  # what its parts add up to
        rank_used=pos + 1,
    )


def e2e_tail(cohorts: Cohorts, rows: np.ndarray, joined: np.ndarray, q: float = 0.99) -> dict[str, Any]:
    """Step 3: the request at the class's q-th end-to-end latency (streams not cancelled), split into
    its TTFT, its decode as the client saw it (first to last token) and the rest to its end."""
    d, table = cohorts.d, cohorts.d.table
    streamed = rows[d.outcome[rows] != metrics.CANCELLED]
    ranked, k, n, pct = _ranked(d.e2e_ms, d.e2e_bound_ms, streamed, table, q)
    out: dict[str, Any] = {
        "q": q,
        "e2e_ms": pct["ms"],
        "censored": bool(pct["censored"]),
        "above_ms": pct["above_ms"],
        "request": None,
        "ttft_ms": None,
        "decode_ms": None,
        "after_last_token_ms": None,
        "server_decode_ms": None,
        "parts": None,
    }
    if n == 0 or k > ranked.size:
        return out
    row = int(ranked[k - 1])
    first, last, end = table.first_token_ns[row], table.last_token_ns[row], table.end_ns[row]
    last = first if np.isnan(last) else last
    server_decode = table.server("server_decode_ns")[row]
    out.update(
        request=_request_id(table, row),
        ttft_ms=float(round(d.ttft_ms[row], 3)),
        decode_ms=_ms(last - first),
        after_last_token_ms=_ms(end - last),
        server_decode_ms=None if np.isnan(server_decode) else _ms(server_decode),
        parts=request_parts(table, row) if joined[row] else None,
    )
    return out


def histogram_at(client: Mapping[str, Any], hists: Mapping[str, Any], q: float, name: str) -> PartsAt:
    """Step 4: the per-run split at q: vLLM's queue, prefill and TTFT quantiles (every request of the
    runs) beside the class's own client TTFT quantile ``client`` (a metrics percentile)."""
    queue = histogram_quantile(hists.get("queue_time"), q)
    ttft = histogram_quantile(hists.get("ttft"), q)
    prefill = histogram_quantile(hists.get("prefill_time"), q)
    if queue is None or ttft is None:
        return _at(q, "vLLM's queue-time and TTFT histograms were not scraped for these runs", pct=client)
    if client.get("censored") or client.get("ms") is None:
        return _at(q, f"the class's {name} is above what was observed: nothing to split", pct=client)
    q_ms, s_ms = queue["ms"], ttft["ms"]
    parts: dict[str, float | None] = {key: None for key in COMPONENT_KEYS}
    parts["queue_ms"] = q_ms
    if prefill is not None:
        parts["prefill_ms"] = prefill["ms"]
        parts["front_end_ms"] = round(s_ms - q_ms - prefill["ms"], 3)
    else:
        parts["server_rest_ms"] = round(s_ms - q_ms, 3)
    parts["network_ms"] = round(float(client["ms"]) - s_ms, 3)
    above = [k for k, h in (("queue", queue), ("TTFT", ttft), ("prefill", prefill)) if h and h["above"]]
    note = "per run, not per request" + (
        f"; the {' and '.join(above)} quantile is past vLLM's last bucket (a lower bound)" if above else ""
    )
    return _at(q, note, pct=client, parts=parts)


def _row(
    key: tuple[str, str, str, str],
    *,
    source: str,
    runs: list[str],
    runs_total: int,
    without: list[JSONObject],
    requests: int,
    joined: int,
    p50: PartsAt,
    p99: PartsAt,
    e2e: JSONObject,
    note: str,
) -> TtftPartsRow:
    cell, mixture, rate, name = key
    return {
        "cell": cell,
        "mixture": mixture,
        "rate": rate,
        "class": name,
        "source": source,
        "per_request": source == "spans",
        "runs": runs,
        "runs_total": runs_total,
        "runs_without_spans": without,
        "requests": requests,
        "joined": joined,
        "joined_share": round(joined / requests, 6) if source == "spans" and requests else None,
        "p50": p50,
        "p99": p99,
        "e2e_p99": e2e,
        "note": note,
    }


def _spans_row(
    key: tuple[str, str, str, str], cohorts: Cohorts, joined: np.ndarray, used: list[str], runs_total: int,
    without: list[JSONObject],
) -> TtftPartsRow:  # fmt: skip
    """Steps 2-3 over the runs whose spans are used."""
    rows = np.concatenate([cohorts.rows(k, key[3]) for k in used])
    left_out = f"; {len(without)} of {runs_total} runs left out (no usable spans)" if without else ""
    return _row(
        key,
        source="spans",
        runs=used,
        runs_total=runs_total,
        without=without,
        requests=int(rows.size),
        joined=int(np.count_nonzero(joined[rows])),
        p50=per_request_at(cohorts, rows, joined, 0.5),
        p99=per_request_at(cohorts, rows, joined, 0.99),
        e2e=e2e_tail(cohorts, rows, joined),
        note="per request, from vLLM's spans joined to the records" + left_out,
    )


def _histogram_row(
    key: tuple[str, str, str, str], cohorts: Cohorts, done: Sequence[RunResult], rows: np.ndarray,
    without: list[JSONObject],
) -> TtftPartsRow:  # fmt: skip
    """Step 4 over the point's done runs: vLLM's histograms, summed."""
    hists = {
        name: merge_histograms((r["server"].get("histograms") or {}).get(name) for r in done)
        for name in ("queue_time", "ttft", "prefill_time")
    }
    source = "histograms" if hists["queue_time"] and hists["ttft"] else "none"
    ttft, bound = cohorts.d.ttft_ms[rows], cohorts.d.ttft_bound_ms[rows]
    seen = ~np.isnan(ttft)
    at = {
        label: histogram_at(
            metrics.censored_percentile(ttft[seen], bound[~seen], q), hists, q, f"TTFT {label}"
        )
        for label, q in QUANTILES
    }
    return _row(
        key,
        source=source,
        runs=[r["key"] for r in done],
        runs_total=len(done),
        without=without,
        requests=int(rows.size),
        joined=0,
        p50=at["p50"],
        p99=at["p99"],
        e2e=e2e_tail(cohorts, rows, np.zeros(len(cohorts.d.table), dtype=bool)),
        note=(
            "per run, not per request: vLLM's histograms over every request of the runs "
            "(all classes, warm-up included), no run with usable spans"
            if source == "histograms"
            else "no split: no run has usable spans and vLLM's queue-time and TTFT histograms were not scraped"
        ),
    )


def ttft_parts(
    *,
    plan: Plan,
    points: SweepPoints,
    cohorts: Cohorts,
    runs: Sequence[RunInput],
) -> TtftParts:
    """Every (cell, mixture, rate, class) with requests: its TTFT split at p50 and p99 (steps 1-4)."""
    joined = _joined(cohorts.d.table)
    inputs: dict[str, Mapping[str, Any]] = {str(r["key"]): r for r in runs}
    rows_out: list[TtftPartsRow] = []
    for cell in plan.cell_ids:
        for mixture, rate in sorted({(c[0], c[1]) for c in points.combos}):
            done = [
                points.done[(cell, mixture, rate, rep)]
                for rep in points.repeats
                if (cell, mixture, rate, rep) in points.done
            ]
            verdicts = {r["key"]: spans_usable(inputs.get(r["key"], {})) for r in done}
            used = [r["key"] for r in done if verdicts[r["key"]][0]]
            without: list[JSONObject] = [
                {"run": k, "reason": why} for k, (ok, why) in verdicts.items() if not ok
            ]
            for name in plan.class_names:
                key = (cell, mixture, rate, name)
                every = (
                    np.concatenate([cohorts.rows(r["key"], name) for r in done]) if done else cohorts.empty
                )
                if every.size == 0:
                    continue  # no done run, or the class has no traffic in this mixture
                if used:
                    rows_out.append(_spans_row(key, cohorts, joined, used, len(done), without))
                else:
                    rows_out.append(_histogram_row(key, cohorts, done, every, without))
    return {
        "components": [{"key": k, "label": label, "what": what} for k, label, what in COMPONENTS],
        "min_share": MIN_SHARE,
        "rows": rows_out,
    }
