"""A columnar form of request records, so an experiment's million records are analysed with numpy.

One row per record; every time is float64 nanoseconds from the run's origin
(exact below 2**53 ns, about 104 days) with NaN for "never observed", which is
what ``None`` means in :class:`workers.replay.records.RequestRecord`.

The per-request gap histograms are optional here: a caller that already merged
them per (run, class) for the cohort (the database service does that in SQL)
passes those instead, see :func:`apps.analysis.metrics.cohort_histograms`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.replay.records import RequestRecord

# Error kinds the replay writes; anything else maps to "other" so an unknown
# kind is still an error, never silently a success.
ERROR_KINDS: tuple[str, ...] = ("http", "connect", "timeout", "protocol", "context", "admission", "other")
ERROR_CODE = {k: i for i, k in enumerate(ERROR_KINDS)}
NO_ERROR = -1

# The scalar columns and the record field each one comes from, in the order
# the database service selects them.
SCALAR_FIELDS: tuple[str, ...] = (
    "index",
    "warmup",
    "planned_ns",
    "sent",
    "sent_ns",
    "admission_delay_ns",
    "first_token_ns",
    "last_token_ns",
    "end_ns",
    "output_tokens",
    "expected_output_tokens",
    "max_gap_ns",
    "http_status",
    "cancelled",
    "unfinished",
)

# vLLM's own timings of each request, joined from its OTLP span (nanoseconds, None where no span
# joined): queue (waiting queue to scheduled), prefill (scheduled to first token), decode (first to
# last token), TTFT (from the request's arrival at the API server) and end-to-end. Optional: a
# table without them reads NaN ("not joined") everywhere, so an older database or a record without
# the fields still loads (apps/analysis/ttft_parts.py reads them).
SERVER_FIELDS: tuple[str, ...] = (
    "server_queue_ns",
    "server_prefill_ns",
    "server_decode_ns",
    "server_ttft_ns",
    "server_e2e_ns",
)


def error_code(kind: str | None) -> int:
    if kind is None:
        return NO_ERROR
    return ERROR_CODE.get(kind, ERROR_CODE["other"])


def _floats(values: Iterable[Any]) -> np.ndarray:
    if isinstance(values, np.ndarray):  # a column read as an array already (record_reader.py)
        return values.astype(np.float64, copy=False)
    # None becomes NaN: numpy does that for float arrays.
    return np.asarray(list(values) if not isinstance(values, (list, tuple)) else values, dtype=np.float64)


@dataclass
class FlatHistograms:
    """Per-request gap histograms flattened: one entry per (row, bucket) with its weight."""

    row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bucket: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    weight: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))


@dataclass
class RecordTable:
    run: np.ndarray  # int code into run_keys
    run_keys: list[str]
    cls: np.ndarray  # int code into class_names
    class_names: list[str]
    index: np.ndarray
    warmup: np.ndarray
    planned_ns: np.ndarray
    sent: np.ndarray
    sent_ns: np.ndarray
    admission_delay_ns: np.ndarray
    first_token_ns: np.ndarray
    last_token_ns: np.ndarray
    end_ns: np.ndarray
    output_tokens: np.ndarray
    expected_output_tokens: np.ndarray
    max_gap_ns: np.ndarray
    http_status: np.ndarray
    error_kind: np.ndarray  # int code into ERROR_KINDS, NO_ERROR for none
    cancelled: np.ndarray
    unfinished: np.ndarray
    token_gaps: FlatHistograms | None = None
    chunk_gaps: FlatHistograms | None = None
    # SERVER_FIELDS present in the source, by name (float64 ns, NaN: not joined); see ``server``.
    server_columns: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.run.shape[0])

    def server(self, name: str) -> np.ndarray:
        """One of SERVER_FIELDS as float64 ns, NaN where no span joined (all NaN when the source had none)."""
        if name not in SERVER_FIELDS:
            raise ValueError(f"{name} is not a server timing field ({', '.join(SERVER_FIELDS)})")
        col = self.server_columns.get(name)
        return col if col is not None else np.full(len(self), np.nan)

    @classmethod
    def from_columns(
        cls,
        *,
        run_keys: Sequence[str],
        run: Sequence[int] | np.ndarray,
        class_names: Sequence[str],
        request_class: Sequence[int] | np.ndarray,
        columns: Mapping[str, Sequence[Any] | np.ndarray],
        error_kind: Sequence[str | None] | np.ndarray,
        token_gaps: FlatHistograms | None = None,
        chunk_gaps: FlatHistograms | None = None,
    ) -> RecordTable:
        """Build from one sequence per field of SCALAR_FIELDS (None allowed where the record allows it);
        the optional SERVER_FIELDS are taken when ``columns`` has them."""
        missing = [f for f in SCALAR_FIELDS if f not in columns]
        if missing:
            raise ValueError(f"missing record columns: {', '.join(missing)}")
        ek = np.asarray(error_kind)
        if ek.dtype.kind not in "iu":
            ek = np.fromiter((error_code(k) for k in ek), dtype=np.int16, count=len(ek))
        return cls(
            run=np.asarray(run, dtype=np.int64),
            run_keys=list(run_keys),
            cls=np.asarray(request_class, dtype=np.int64),
            class_names=list(class_names),
            index=np.asarray(columns["index"], dtype=np.int64),
            warmup=np.asarray(columns["warmup"], dtype=bool),
            planned_ns=_floats(columns["planned_ns"]),
            sent=np.asarray(columns["sent"], dtype=bool),
            sent_ns=_floats(columns["sent_ns"]),
            admission_delay_ns=_floats(columns["admission_delay_ns"]),
            first_token_ns=_floats(columns["first_token_ns"]),
            last_token_ns=_floats(columns["last_token_ns"]),
            end_ns=_floats(columns["end_ns"]),
            output_tokens=_floats(columns["output_tokens"]),
            expected_output_tokens=_floats(columns["expected_output_tokens"]),
            max_gap_ns=_floats(columns["max_gap_ns"]),
            http_status=_floats(columns["http_status"]),
            error_kind=ek.astype(np.int16),
            cancelled=np.asarray(columns["cancelled"], dtype=bool),
            unfinished=np.asarray(columns["unfinished"], dtype=bool),
            token_gaps=token_gaps,
            chunk_gaps=chunk_gaps,
            server_columns={f: _floats(columns[f]) for f in SERVER_FIELDS if f in columns},
        )

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord]) -> RecordTable:
        """Columnar copy of RequestRecord objects, gap histograms included."""
        run_code: dict[str, int] = {}
        class_code: dict[str, int] = {}
        runs: list[int] = []
        classes: list[int] = []
        kinds: list[int] = []
        cols: dict[str, list[Any]] = {f: [] for f in (*SCALAR_FIELDS, *SERVER_FIELDS)}
        hists: dict[str, tuple[list[int], list[int], list[float]]] = {
            "token_gaps": ([], [], []),
            "chunk_gaps": ([], [], []),
        }
        for row, rec in enumerate(records):
            runs.append(run_code.setdefault(str(rec.run_id), len(run_code)))
            classes.append(class_code.setdefault(rec.request_class, len(class_code)))
            kinds.append(error_code(rec.error_kind))
            for f in SCALAR_FIELDS:
                cols[f].append(getattr(rec, f))
            for f in SERVER_FIELDS:  # absent from a record made before the spans were joined
                cols[f].append(getattr(rec, f, None))
            for name in ("token_gaps", "chunk_gaps"):
                rows, buckets, weights = hists[name]
                for b, w in getattr(rec, name).counts.items():
                    rows.append(row)
                    buckets.append(int(b))
                    weights.append(float(w))
        flat = {
            name: FlatHistograms(
                row=np.asarray(r, dtype=np.int64),
                bucket=np.asarray(b, dtype=np.int64),
                weight=np.asarray(w, dtype=np.float64),
            )
            for name, (r, b, w) in hists.items()
        }
        return cls.from_columns(
            run_keys=list(run_code),
            run=runs,
            class_names=list(class_code),
            request_class=classes,
            columns=cols,
            error_kind=np.asarray(kinds, dtype=np.int16),
            token_gaps=flat["token_gaps"],
            chunk_gaps=flat["chunk_gaps"],
        )

    @classmethod
    def concat(cls, tables: Sequence[RecordTable]) -> RecordTable:
        """One table from several (e.g. one per run), re-coding runs and classes."""
        run_keys: list[str] = []
        class_names: list[str] = []
        for t in tables:
            for k in t.run_keys:
                if k not in run_keys:
                    run_keys.append(k)
            for c in t.class_names:
                if c not in class_names:
                    class_names.append(c)
        run_map = {k: i for i, k in enumerate(run_keys)}
        class_map = {c: i for i, c in enumerate(class_names)}

        def joined(name: str) -> np.ndarray:
            parts = [getattr(t, name) for t in tables]
            return np.concatenate(parts) if parts else np.zeros(0)

        runs = [np.asarray([run_map[k] for k in t.run_keys], dtype=np.int64)[t.run] for t in tables]
        clss = [
            np.asarray([class_map[c] for c in t.class_names], dtype=np.int64)[t.cls]
            if t.class_names
            else np.zeros(0, dtype=np.int64)
            for t in tables
        ]
        hist: dict[str, FlatHistograms | None] = {}
        for name in ("token_gaps", "chunk_gaps"):
            if all(getattr(t, name) is not None for t in tables) and tables:
                offsets = np.cumsum([0] + [len(t) for t in tables[:-1]])
                hist[name] = FlatHistograms(
                    row=np.concatenate(
                        [getattr(t, name).row + o for t, o in zip(tables, offsets, strict=True)]
                    ),
                    bucket=np.concatenate([getattr(t, name).bucket for t in tables]),
                    weight=np.concatenate([getattr(t, name).weight for t in tables]),
                )
            else:
                hist[name] = None
        server = {
            f: np.concatenate([t.server(f) for t in tables])
            for f in SERVER_FIELDS
            if any(f in t.server_columns for t in tables)
        }
        return cls(
            run=np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64),
            run_keys=run_keys,
            cls=np.concatenate(clss) if clss else np.zeros(0, dtype=np.int64),
            class_names=class_names,
            index=joined("index").astype(np.int64),
            warmup=joined("warmup").astype(bool),
            planned_ns=joined("planned_ns").astype(np.float64),
            sent=joined("sent").astype(bool),
            sent_ns=joined("sent_ns").astype(np.float64),
            admission_delay_ns=joined("admission_delay_ns").astype(np.float64),
            first_token_ns=joined("first_token_ns").astype(np.float64),
            last_token_ns=joined("last_token_ns").astype(np.float64),
            end_ns=joined("end_ns").astype(np.float64),
            output_tokens=joined("output_tokens").astype(np.float64),
            expected_output_tokens=joined("expected_output_tokens").astype(np.float64),
            max_gap_ns=joined("max_gap_ns").astype(np.float64),
            http_status=joined("http_status").astype(np.float64),
            error_kind=joined("error_kind").astype(np.int16),
            cancelled=joined("cancelled").astype(bool),
            unfinished=joined("unfinished").astype(bool),
            token_gaps=hist["token_gaps"],
            chunk_gaps=hist["chunk_gaps"],
            server_columns=server,
        )
