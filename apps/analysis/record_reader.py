"""The records of some runs as columns (apps/analysis/columns.RecordTable), read from the database.

On Postgres the rows travel packed: ``COPY (SELECT ...) TO STDOUT (FORMAT BINARY)`` with every
column made fixed-width in SQL (times as float8 with NaN for NULL, flags as bool, the class and
the error kind as small integer codes), so each row is the same number of bytes and numpy reads
the whole stream as one structured array (``np.frombuffer``): no Python object per value. On
SQLite (the embedded default) a plain client-side cursor per batch of runs, as before.

Either way the rows come per batch of ``RUN_BATCH`` runs in the order the database returns them,
and the table is the same (tests/analysis/test_record_reader.py reads both ways and compares).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import connection

from apps.analysis.columns import (
    ERROR_CODE,
    ERROR_KINDS,
    NO_ERROR,
    SCALAR_FIELDS,
    SERVER_FIELDS,
    RecordTable,
    error_code,
)
from apps.analysis.report_inputs import StoredRun
from apps.experiments.models import RequestClass
from apps.runs.models import RequestRecord as RecordRow

# Runs per records query: about 130,000 rows at a time at 1,000,000 records over 126 runs.
RUN_BATCH = 16
BOOL_FIELDS = frozenset({"warmup", "sent", "cancelled", "unfinished"})
# Binary COPY: an 11-byte signature, 32-bit flags and header-extension length; a 16-bit -1 ends it.
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"


@dataclass(frozen=True)
class Packed:
    """The records of some runs as flat arrays, before they become a RecordTable: ``columns`` holds
    "run" (the run's position in the runs read), "cls" (a position in ``class_names``),
    "error_kind" (int16 codes) and every field of ``fields`` (bool or float64, NaN for NULL).
    apps/analysis/run_digest.py packs a run's slice of it."""

    columns: dict[str, np.ndarray]
    class_names: list[str]
    fields: tuple[str, ...]  # SCALAR_FIELDS, then the SERVER_FIELDS the table has

    def table(self, run_inputs: Sequence[StoredRun]) -> RecordTable:
        return RecordTable.from_columns(
            run_keys=[r["key"] for r in run_inputs],
            run=self.columns["run"],
            class_names=self.class_names,
            request_class=self.columns["cls"],
            columns={name: self.columns[name] for name in self.fields},
            error_kind=self.columns["error_kind"],
        )


def record_fields() -> tuple[str, ...]:
    """The scalar fields a table reads: SCALAR_FIELDS and the SERVER_FIELDS the records table has."""
    columns = {f.name for f in RecordRow._meta.concrete_fields}
    return (*SCALAR_FIELDS, *(f for f in SERVER_FIELDS if f in columns))


def load_table(run_inputs: Sequence[StoredRun]) -> RecordTable:
    """Every record of the given runs as columns (runs coded by their order in ``run_inputs``)."""
    return load_packed(run_inputs).table(run_inputs)


def load_packed(run_inputs: Sequence[StoredRun]) -> Packed:
    """Every record of the given runs as flat arrays (see Packed), read from the records table."""
    server_fields = record_fields()[len(SCALAR_FIELDS) :]
    if connection.vendor == "postgresql":
        return _load_packed(run_inputs, server_fields)
    return _load_rows(run_inputs, server_fields)


def _batches(run_inputs: Sequence[StoredRun]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    pks = np.asarray([r["pk"] for r in run_inputs], dtype=np.int64)
    pk_order = np.argsort(pks)
    return pks, pk_order, [[int(p) for p in pks[lo : lo + RUN_BATCH]] for lo in range(0, pks.size, RUN_BATCH)]


def _packed(
    server_fields: tuple[str, ...], parts: dict[str, list[np.ndarray]], class_names: list[str]
) -> Packed:
    def cat(name: str, dtype: Any) -> np.ndarray:
        return np.concatenate(parts[name]) if parts[name] else np.zeros(0, dtype=dtype)

    fields = (*SCALAR_FIELDS, *server_fields)
    columns = {name: cat(name, bool if name in BOOL_FIELDS else np.float64) for name in fields}
    columns.update(run=cat("run", np.int64), cls=cat("cls", np.int64), error_kind=cat("error_kind", np.int16))
    return Packed(columns=columns, class_names=class_names, fields=fields)


def _load_rows(run_inputs: Sequence[StoredRun], server_fields: tuple[str, ...]) -> Packed:
    """A plain client-side cursor per batch of runs: a server-side cursor (what QuerySet.iterator()
    uses on Postgres) costs a round trip per few hundred rows, and model instances or dicts would
    cost far more than the tuples."""
    pks, pk_order, batches = _batches(run_inputs)
    qn = connection.ops.quote_name
    fields = ("run_id", "request_class", "error_kind", *SCALAR_FIELDS, *server_fields)
    table = qn(RecordRow._meta.db_table)
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    class_code: dict[str, int] = {}
    with connection.cursor() as cursor:
        for batch in batches:
            marks = ", ".join(["%s"] * len(batch))
            # Identifiers come from the model's metadata; the run ids are parameters.
            sql = f"SELECT {', '.join(qn(f) for f in fields)} FROM {table} WHERE {qn('run_id')} IN ({marks})"  # noqa: S608
            cursor.execute(sql, batch)
            rows = cursor.fetchall()
            if not rows:
                continue
            cols = list(zip(*rows, strict=True))
            del rows
            run_pk = np.asarray(cols[0], dtype=np.int64)
            parts["run"].append(pk_order[np.searchsorted(pks, run_pk, sorter=pk_order)])
            names, inverse = np.unique(np.asarray(cols[1], dtype=object), return_inverse=True)
            codes = np.asarray(
                [class_code.setdefault(str(n), len(class_code)) for n in names], dtype=np.int64
            )
            parts["cls"].append(codes[inverse.reshape(-1)])
            kinds = np.asarray(cols[2], dtype=object)
            ek = np.full(kinds.size, NO_ERROR, dtype=np.int16)
            failed = np.flatnonzero(kinds != None)  # noqa: E711 - elementwise comparison
            ek[failed] = [error_code(k) for k in kinds[failed]]
            parts["error_kind"].append(ek)
            for name, col in zip((*SCALAR_FIELDS, *server_fields), cols[3:], strict=True):
                # None becomes NaN in a float array: "never observed" survives.
                parts[name].append(np.asarray(col, dtype=bool if name in BOOL_FIELDS else np.float64))
    return _packed(server_fields, parts, list(class_code))


def _load_packed(run_inputs: Sequence[StoredRun], server_fields: tuple[str, ...]) -> Packed:
    """Binary COPY of one row per batch of runs: every column one array (``array_agg``), read by numpy.

    COPY sends one message per row, so a row per record would cost a Python call each; a row per
    batch holding each column as an array costs one. The arrays are fixed-width: the run's
    primary key (int8), the class's position in the batch's class list (int4, ``array_position``),
    the error kind's code (int2: -1 none, ``ERROR_KINDS`` order, an unknown kind "other" as
    ``error_code`` maps it), then every scalar field as float8 (NULL as NaN) or bool. Every
    aggregate of the one group reads the scan's rows in the same order, so the arrays line up.
    The classes are coded by their position in the experiments' class names (a DISTINCT over
    the batch would cost a third of the read), then as the row reader codes them.
    """
    pks, pk_order, batches = _batches(run_inputs)
    qn = connection.ops.quote_name
    table = qn(RecordRow._meta.db_table)
    scalars = (*SCALAR_FIELDS, *server_fields)
    kinds = "ARRAY[" + ", ".join(f"'{k}'" for k in ERROR_KINDS) + "]::text[]"
    arrays: list[tuple[str, str, str]] = [
        ("run", "run_id::int8", ">i8"),
        ("cls", "array_position(%s::text[], request_class::text)::int4", ">i4"),
        (
            "error_kind",
            f"(CASE WHEN error_kind IS NULL THEN {NO_ERROR} "
            f"ELSE COALESCE(array_position({kinds}, error_kind::text) - 1, {ERROR_CODE['other']}) END)::int2",
            ">i2",
        ),
    ]
    for name in scalars:
        if name in BOOL_FIELDS:
            arrays.append((name, f"COALESCE({qn(name)}, false)", "?"))
        else:
            arrays.append((name, f"COALESCE({qn(name)}::float8, 'NaN'::float8)", ">f8"))
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    class_code: dict[str, int] = {}
    # The experiments' class names: a record of another class (none is written today) sends its
    # batch through a DISTINCT over the batch's rows first, and the read again.
    known = sorted(
        set(
            RequestClass.objects.filter(experiment__runs__pk__in=[int(p) for p in pks]).values_list(
                "name", flat=True
            )
        )
    )
    with connection.cursor() as cursor:
        pg = cursor.cursor  # psycopg's own cursor, for COPY
        for batch in batches:
            marks = ", ".join(["%s"] * len(batch))
            where = f"WHERE {qn('run_id')} IN ({marks})"
            aggs = ", ".join(f"array_agg({expr})" for _, expr, _ in arrays)
            # Identifiers and the error kinds come from the code; class names and run ids are parameters.
            sql = f"COPY (SELECT {aggs} FROM {table} {where}) TO STDOUT (FORMAT BINARY)"  # noqa: S608
            names = known
            columns = _copy_arrays(pg, sql, [names, *batch], arrays)
            if columns is None:
                cursor.execute(f"SELECT DISTINCT request_class FROM {table} {where}", batch)  # noqa: S608
                names = sorted(str(n) for (n,) in cursor.fetchall())
                columns = _copy_arrays(pg, sql, [names, *batch], arrays)
            if columns is None or columns[0].size == 0:
                continue
            # Coded as the row reader codes them: the batch's names in sorted order, first seen first.
            raw = columns[1].astype(np.int64) - 1
            present = np.unique(raw)
            codes = np.full(len(names), -1, dtype=np.int64)
            for i in present:
                codes[i] = class_code.setdefault(names[int(i)], len(class_code))
            parts["run"].append(pk_order[np.searchsorted(pks, columns[0].astype(np.int64), sorter=pk_order)])
            parts["cls"].append(codes[raw])
            parts["error_kind"].append(columns[2].astype(np.int16))
            for (name, _, _), col in zip(arrays[3:], columns[3:], strict=True):
                parts[name].append(col.astype(bool if name in BOOL_FIELDS else np.float64))
    return _packed(server_fields, parts, list(class_code))


def _copy_arrays(
    pg: Any, sql: str, params: Sequence[Any], arrays: Sequence[tuple[str, str, str]]
) -> list[np.ndarray] | None:
    """The batch's columns, or None where a class name was not in the list (a NULL position)."""
    with pg.copy(sql, params) as copy:
        data = b"".join(bytes(block) for block in copy)
    return _binary_arrays(data, [dtype for _, _, dtype in arrays])


def _binary_arrays(data: bytes, dtypes: Sequence[str]) -> list[np.ndarray] | None:
    """The one row of a binary COPY whose fields are one-dimensional arrays without NULLs.

    The stream: the signature, 32-bit flags and header-extension length, then per row a 16-bit
    field count and per field a 32-bit byte length; an array is its dimensions (32-bit), a NULL
    flag, the element type, per dimension its size and lower bound, then per element a 32-bit
    length and the value, all big-endian.
    """
    if not data.startswith(_SIGNATURE):
        raise ValueError("the database's binary COPY stream has no PGCOPY signature")
    at = len(_SIGNATURE) + 8 + int.from_bytes(data[len(_SIGNATURE) + 4 : len(_SIGNATURE) + 8], "big")
    fields = int.from_bytes(data[at : at + 2], "big", signed=True)
    if fields != len(dtypes):
        raise ValueError(f"the database's binary COPY row has {fields} fields, not {len(dtypes)}")
    at += 2
    out = []
    for dtype in dtypes:
        size = int.from_bytes(data[at : at + 4], "big", signed=True)
        at += 4
        if size < 0:  # array_agg of no rows is NULL
            out.append(np.zeros(0, dtype=dtype))
            continue
        ndim, has_null = (int.from_bytes(data[at + i : at + i + 4], "big") for i in (0, 4))
        if has_null:
            return None
        if ndim != 1:
            raise ValueError("the database's binary COPY array is not one-dimensional")
        count = int.from_bytes(data[at + 12 : at + 16], "big")
        element = np.dtype([("len", ">i4"), ("value", dtype)])
        values = np.frombuffer(data, dtype=element, count=count, offset=at + 20)
        out.append(values["value"])
        at += size
    return out
