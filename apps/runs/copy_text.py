"""A batch of observed records as the body of one Postgres ``COPY ... FROM STDIN`` in text format.

Why not psycopg's ``copy.write_row``: it takes one Python sequence per row and adapts each
value on its own, and the ingest used to build a dict per record and ``json.dumps`` two gap
histograms per record to feed it; at a thousand records a batch that Python work, not the
server, was most of an ingest's time (bench/results/ingest.md). Here the batch is built a
column at a time (one pass over the records per column, in comprehensions and ``map``) and
the rows are joined into one string, written with one ``copy.write``.

The text format, as Postgres reads it (the ``COPY`` page of its manual): columns split by a
tab, rows by a newline, NULL is ``\\N``, and a backslash starts an escape; so a text value has
its backslashes, tabs, newlines and carriage returns escaped, and nothing else. Booleans are
``t``/``f``; integers their decimal digits; a gap histogram the JSON text of
``GapHistogram.to_json`` (digits, quotes, colons, commas: nothing to escape).

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


def gaps_json(hist: GapHistogram) -> str:
    """``json.dumps(hist.to_json())`` without building the dict: bucket keys in order, a weight
    that is a whole number written as an integer. Postgres parses it into jsonb either way;
    the text only has to mean the same."""
    parts = [
        f'"{b}": {int(c) if float(c).is_integer() else float(c)!r}' for b, c in sorted(hist.counts.items())
    ]
    return "{" + ", ".join(parts) + "}"


def _column(kind: Kind, nullable: bool, values: list[Any]) -> list[str]:
    if kind == "int":
        if not nullable:
            return list(map(str, values))
        return [NULL if v is None else str(v) for v in values]
    if kind == "bool":
        return [NULL if v is None else ("t" if v else "f") for v in values]
    if kind == "text":
        return [NULL if v is None else v.translate(_ESCAPES) for v in values]
    # Two histograms of a record, or of two records, often hold the same buckets (a stream
    # of one token per chunk has equal chunk and token gaps): the text is made once per content.
    seen: dict[tuple[tuple[int, float], ...], str] = {}
    out = []
    for hist in values:
        if hist is None:
            out.append(NULL)
            continue
        key = tuple(hist.counts.items())
        text = seen.get(key)
        if text is None:
            text = seen[key] = gaps_json(hist)
        out.append(text)
    return out


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
