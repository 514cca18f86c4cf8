"""A batch of observed records as the data of one Postgres ``COPY`` in text format: builds, never writes.

Why not psycopg's ``copy.write_row``: it takes one Python sequence per row and adapts each
value on its own, and the ingest used to build a dict per record and ``json.dumps`` two gap
histograms per record to feed it; at a thousand records a batch that Python work, not the
server, was most of an ingest's time (bench/results/ingest.md). Here a chunk of records is
built a group of columns at a time and the rows joined into one string, written with one
``copy.write`` (the ingest calls this per chunk of a batch: apps/runs/ingest.py):

- each run of adjacent integer and boolean columns is one ``%`` format per record, fed the
  record's values as one tuple (``attrgetter`` of all their names): the rows of the chunk are
  formatted, joined, their ``None`` turned into NULL by one ``replace`` over the joined text
  (it holds nothing but numbers, ``True``/``False`` and ``None``), and split again;
- a text column is one escaped text per distinct value, remembered (classes, finish reasons,
  backends and NULLs repeat);
- a gap histogram column is one JSON text per record, from remembered bucket texts.

The caller orders the columns so that the numbers sit together (apps/runs/ingest.py): the same
rows come out for any order, only slower.

The text format, as Postgres reads it (the ``COPY`` page of its manual): columns split by a
tab, rows by a newline, NULL is ``\\N``, and a backslash starts an escape; so a text value has
its backslashes, tabs, newlines and carriage returns escaped, and nothing else. Integers are
their decimal digits (``str``); booleans ``True``/``False``, which the boolean type reads as
it reads ``t``/``f``; a gap histogram the JSON text of ``GapHistogram.to_json`` (digits,
quotes, colons, commas, points: nothing to escape).

Pure: no Django, so it is tested without a database (tests/runs/test_copy_text.py) as well
as through the real COPY (tests/runs/test_ingest_copy.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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


class _Remembered(dict[Any, str]):
    """Texts made once per key and looked up after: a bounded table (``limit`` entries; past it,
    each text is made anew and not kept), so a stream of distinct values cannot grow it."""

    def __init__(self, make: Callable[[Any], str], limit: int) -> None:
        super().__init__()
        self._make, self._limit = make, limit

    def __missing__(self, key: Any) -> str:
        text = self._make(key)
        if len(self) < self._limit:
            self[key] = text
        return text


def _bucket(key: tuple[int, float]) -> str:
    bucket, weight = key
    number = int(weight) if float(weight).is_integer() else float(weight)
    return f'"{int(bucket)}": {number!r}'


# The text of one bucket of a gap histogram, ``"key": weight``, per (bucket, weight): a stream's
# histograms hold tens of buckets, and formatting each number anew was most of the cost of a
# record (bench/results/ingest.md, 2026-12-04). Buckets are a few hundred at most and weights
# mostly small whole numbers. (1, 2) and (1, 2.0) are one key, and one text: a whole weight is
# written as an integer either way.
_bucket_text = _Remembered(_bucket, 1 << 16).__getitem__
# A text value escaped, or NULL for None; error messages may all differ, so the table is small.
_text = _Remembered(lambda v: NULL if v is None else escape(v), 4096).__getitem__


def gaps_json(hist: GapHistogram | None) -> str:
    """The JSON of ``hist.to_json()`` (NULL for None): the same keys in the same (sorted) order
    and the same numbers, a whole weight written as an integer (jsonb keeps ``7`` and ``7.0``
    apart). jsonb sorts an object's keys whatever the text's order, but sorts keys already in
    order faster: sorting them here costs this process about what it saves the server
    (bench/results/ingest.md, 2026-12-04). The bucket numbers are sorted, not the (bucket,
    weight) pairs: comparing ints is the cheaper sort."""
    if hist is None:
        return NULL
    counts = hist.counts
    if len(counts) == 1:  # a short answer's histogram: no sort, no join
        return "{" + _bucket_text(next(iter(counts.items()))) + "}"
    buckets = sorted(counts)
    return (
        "{" + ", ".join(map(_bucket_text, zip(buckets, map(counts.__getitem__, buckets), strict=True))) + "}"
    )


def _numbers(names: Sequence[str], constants: dict[str, str], records: Sequence[Observed]) -> list[str]:
    """Each record's text of the adjacent integer and boolean columns ``names`` (a constant's
    text where ``constants`` has one), tab-separated, NULL for None."""
    for n in names:
        if n in constants and not constants[n].removeprefix("-").isdigit():
            raise ValueError(f"the constant of integer column {n!r} is not an integer: {constants[n]!r}")
    fmt = "\t".join(constants[n] if n in constants else "%s" for n in names)
    read = [n for n in names if n not in constants]
    if not read:
        return [fmt] * len(records)
    get = attrgetter(*read)
    values: Iterable[Any] = map(get, records) if len(read) > 1 else ((v,) for v in map(get, records))
    # The joined rows hold only digits, signs, tabs, newlines, True/False and None: the one
    # replace turns every None, and nothing else, into NULL.
    return "\n".join(map(fmt.__mod__, values)).replace("None", NULL).split("\n")


def copy_text(
    columns: Sequence[tuple[str, Kind, bool]], records: Sequence[Observed], constants: dict[str, str]
) -> str:
    """The rows of ``records`` for ``COPY table (columns) FROM STDIN``, each line ending in a newline.

    ``columns`` are (name, kind, nullable) in the order of the COPY's column list; a name in
    ``constants`` gets that text, COPY text already, on every row (the run's key: an integer
    column's constant must be an integer's digits), any other is read off each record by its
    attribute of the same name."""
    if not records:
        return ""
    groups: list[list[str]] = []
    numbers: list[str] = []
    for name, kind, _nullable in columns:
        if kind in ("int", "bool"):
            numbers.append(name)
            continue
        if numbers:
            groups.append(_numbers(numbers, constants, records))
            numbers = []
        if name in constants:
            groups.append([constants[name]] * len(records))
            continue
        values = map(attrgetter(name), records)
        groups.append(list(map(_text, values)) if kind == "text" else list(map(gaps_json, values)))
    if numbers:
        groups.append(_numbers(numbers, constants, records))
    return "\n".join(map("\t".join, zip(*groups, strict=True))) + "\n"
