"""A batch of observed records as the data of one Postgres ``COPY`` in text format: builds, never writes.

Why not psycopg's ``copy.write_row``: it takes one Python sequence per row and adapts each
value on its own, and the ingest used to build a dict per record and ``json.dumps`` two gap
histograms per record to feed it; at a thousand records a batch that Python work, not the
server, was most of an ingest's time (bench/results/ingest.md). Here the records are built a
column at a time (one pass over the records per column, in comprehensions and ``map``) and
the rows joined into one string, written with one ``copy.write`` (the ingest calls this per
chunk of a batch: apps/runs/ingest.py).

The text format, as Postgres reads it (the ``COPY`` page of its manual): columns split by a
tab, rows by a newline, NULL is ``\\N``, and a backslash starts an escape; so a text value has
its backslashes, tabs, newlines and carriage returns escaped, and nothing else. Booleans are
``t``/``f``; integers their decimal digits; a gap histogram the JSON text of
``GapHistogram.to_json`` (digits, quotes, colons, commas, points: nothing to escape).

Pure: no Django, so it is tested without a database (tests/runs/test_copy_text.py) as well
as through the real COPY (tests/runs/test_ingest_copy.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Literal

from workers.replay.records import GapHistogram
from workers.replay.records import RequestRecord as Observed

Kind = Literal["int", "bool", "text", "gaps"]

NULL = "\\N"
# Backslash first in meaning only: str.translate maps each character once, so the backslashes
# it writes are never escaped again.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def escape(value: str) -> str:
    """One text value as COPY's text format reads it back unchanged."""
    return value.translate(_ESCAPES)


class _Buckets(dict[tuple[int, float], str]):
    """The text of one bucket of a gap histogram, ``"key": weight``, made once per (bucket,
    weight) seen: a stream's histograms hold tens of buckets, and formatting each number anew
    was most of the cost of a record (bench/results/ingest.md, 2026-12-04). Buckets are a few
    hundred at most and weights mostly small whole numbers, so the table stays small; it stops
    growing at ``_LIMIT`` entries all the same."""

    _LIMIT = 1 << 16

    def __missing__(self, key: tuple[int, float]) -> str:
        bucket, weight = key
        number = int(weight) if float(weight).is_integer() else float(weight)
        text = f'"{int(bucket)}": {number!r}'
        if len(self) < self._LIMIT:
            self[key] = text
        return text


_bucket_text = _Buckets().__getitem__


def gaps_json(hist: GapHistogram) -> str:
    """The JSON of ``hist.to_json()``: the same keys in the same (sorted) order and the same
    numbers, a whole weight written as an integer (jsonb keeps ``7`` and ``7.0`` apart). jsonb
    sorts an object's keys whatever the text's order, but sorts keys already in order faster:
    sorting them here costs this process about what it saves the server, and the server is
    the slower side of the COPY (bench/results/ingest.md, 2026-12-04). The bucket numbers are
    sorted, not the (bucket, weight) pairs: comparing ints is the cheaper sort."""
    counts = hist.counts
    buckets = sorted(counts)
    return (
        "{" + ", ".join(map(_bucket_text, zip(buckets, map(counts.__getitem__, buckets), strict=True))) + "}"
    )


def _column(kind: Kind, nullable: bool, values: list[Any]) -> list[str]:
    if kind == "int":
        if not nullable:
            return list(map(str, values))
        return [NULL if v is None else str(v) for v in values]
    if kind == "bool":
        return [NULL if v is None else ("t" if v else "f") for v in values]
    if kind == "text":
        return [NULL if v is None else v.translate(_ESCAPES) for v in values]
    return [NULL if h is None else gaps_json(h) for h in values]


def copy_text(
    columns: Sequence[tuple[str, Kind, bool]], records: Sequence[Observed], constants: dict[str, str]
) -> str:
    """The rows of ``records`` for ``COPY table (columns) FROM STDIN``, each line ending in a newline.

    ``columns`` are (name, kind, nullable) in the order of the COPY's column list; a name in
    ``constants`` gets that text on every row (the run's key), any other is read off each record
    by its attribute of the same name."""
    if not records:
        return ""
    per_column: list[list[str]] = []
    for name, kind, nullable in columns:
        if name in constants:
            per_column.append([constants[name]] * len(records))
        else:
            per_column.append(_column(kind, nullable, list(map(attrgetter(name), records))))
    return "\n".join(map("\t".join, zip(*per_column, strict=True))) + "\n"
