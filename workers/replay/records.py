"""Typed per-request records and the compact gap histogram they carry.

This module is the contract between the load generator (which fills records),
the database ingest (which stores them) and the analysis (which reads them).
It imports nothing of ours, so it runs unchanged on a GPU host.

Every time is an integer count of nanoseconds from the run's origin, taken
with ``time.perf_counter_ns``. A time that was never observed is ``None``,
never 0. The ``server_*_ns`` fields are durations the server measured on its own
clocks (vLLM's span of the request), joined after the run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# Relative width of one histogram bucket: a quantile read back from the
# histogram is within +/- 2% of the true value, small enough that a p99
# inter-token gap is not blurred, coarse enough that a 128-token stream needs
# only a handful of buckets.
_GROWTH = 1.04
_LOG_GROWTH = math.log(_GROWTH)
# Gaps below 1 microsecond are clock noise; they all land in bucket 0.
_MIN_US = 1.0


def _bucket(value_us: float) -> int:
    if value_us <= _MIN_US:
        return 0
    return 1 + int(math.log(value_us / _MIN_US) / _LOG_GROWTH)


def _bucket_mid_us(index: int) -> float:
    if index == 0:
        return _MIN_US / 2
    lo = _MIN_US * _GROWTH ** (index - 1)
    return lo * math.sqrt(_GROWTH)


@dataclass
class GapHistogram:
    """Log-bucketed histogram of durations in microseconds.

    Mergeable across requests and runs, so per-class percentiles of
    inter-token latency never need every token timestamp.
    """

    counts: dict[int, float] = field(default_factory=dict)

    def add(self, value_us: float, weight: float = 1.0) -> None:
        b = _bucket(value_us)
        self.counts[b] = self.counts.get(b, 0.0) + weight

    def merge(self, other: GapHistogram) -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0.0) + c

    @property
    def total(self) -> float:
        return sum(self.counts.values())

    def quantile(self, q: float) -> float | None:
        """Value (us) at quantile q in [0, 1]; None for an empty histogram."""
        total = self.total
        if total <= 0:
            return None
        target = q * total
        seen = 0.0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= target:
                return _bucket_mid_us(b)
        return _bucket_mid_us(max(self.counts))

    def to_json(self) -> dict[str, float]:
        # JSON object keys are strings; weights stay integers when they are.
        return {str(b): (int(c) if float(c).is_integer() else c) for b, c in sorted(self.counts.items())}

    @classmethod
    def from_json(cls, data: Mapping[str, float] | None) -> GapHistogram:
        return cls({int(k): float(v) for k, v in (data or {}).items()})


@dataclass
class RequestRecord:
    """What the load generator observed for one request of a trace."""

    run_id: str
    index: int
    request_class: str
    warmup: bool
    input_tokens: int
    expected_output_tokens: int
    planned_ns: int
    sent_ns: int | None = None
    # Time spent waiting for a client-side concurrency slot (0 without a cap).
    admission_delay_ns: int | None = None
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    end_ns: int | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    chunks: int = 0
    # Largest gap between two token-bearing chunks (the request's max stall).
    max_gap_ns: int | None = None
    # Gaps between consecutive token-bearing chunks, one count per chunk.
    chunk_gaps: GapHistogram = field(default_factory=GapHistogram)
    # The same gaps spread over the tokens each chunk carried (gap / tokens,
    # weighted by tokens): per-token latency, not per-network-chunk.
    token_gaps: GapHistogram = field(default_factory=GapHistogram)
    http_status: int | None = None
    error_kind: str | None = None  # http | connect | timeout | protocol | context | None
    error: str | None = None
    finish_reason: str | None = None
    cancelled: bool = False
    unfinished: bool = False
    sent: bool = True
    priority: int = 0
    # Recovery rehearsals only: the stream was open on the candidate at the drain deadline
    # after the switch and the client cut it there (also ``unfinished``: it never ended).
    cut: bool = False
    # Recovery rehearsals only: which server answered ("candidate", "b0", a router's
    # header value, or "unknown"); empty for every other run.
    backend: str = ""
    # The server's own timings of this request, from vLLM's OTLP span joined by request id
    # after the run (workers/engine/spans.py); None where no span was joined. Durations in
    # nanoseconds, not times from the origin: time in the scheduler's queue, in the model from
    # the first schedule to the first token (prefill) and from there to the last (decode), and
    # from the server's arrival to its first token (TTFT) and to the request's end (E2E).
    server_queue_ns: int | None = None
    server_prefill_ns: int | None = None
    server_decode_ns: int | None = None
    server_ttft_ns: int | None = None
    server_e2e_ns: int | None = None
    # Times, not durations: the server's arrival and first token of this request on the server's
    # clock, moved onto the replay's (ns from the origin, like ``sent_ns``; workers/engine/spans.py
    # ``_align_clocks``). None where no span joined.
    server_arrival_ns: int | None = None
    server_first_token_ns: int | None = None

    @property
    def ok(self) -> bool:
        return (
            self.sent
            and self.error_kind is None
            and not self.cancelled
            and not self.unfinished
            and not self.cut
            and self.http_status == 200
        )

    def to_json(self) -> dict[str, Any]:
        # Every field but the two histograms is an immutable scalar: read them as they are,
        # in field order, rather than through dataclasses.asdict, whose deep copy costs ten
        # times as much; a replay's child process serialises every record while its loop runs.
        data = {name: getattr(self, name) for name in _RECORD_FIELDS}
        data["chunk_gaps"] = self.chunk_gaps.to_json()
        data["token_gaps"] = self.token_gaps.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        values = dict(data)
        values["chunk_gaps"] = GapHistogram.from_json(values.get("chunk_gaps"))
        values["token_gaps"] = GapHistogram.from_json(values.get("token_gaps"))
        known = cls.__dataclass_fields__
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown record fields: {', '.join(sorted(unknown))}")
        return cls(**values)


def merge_histograms(hists: Iterable[GapHistogram]) -> GapHistogram:
    out = GapHistogram()
    for h in hists:
        out.merge(h)
    return out


# The server's own timings of a request (vLLM's span, joined after the run by request id).
# Its five durations (ServerSpan.timings), then the two times moved onto the replay's clock.
SERVER_DURATION_FIELDS: tuple[str, ...] = (
    "server_queue_ns",
    "server_prefill_ns",
    "server_decode_ns",
    "server_ttft_ns",
    "server_e2e_ns",
)
SERVER_TIMING_FIELDS: tuple[str, ...] = (
    *SERVER_DURATION_FIELDS,
    "server_arrival_ns",
    "server_first_token_ns",
)


# Every per-request value of a record except its run and its gap histograms: what
# a RequestRecord is rebuilt from, and what the scenario and probe checks read.
SCALAR_RECORD_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(RequestRecord) if f.name not in ("run_id", "chunk_gaps", "token_gaps")
)


_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
