"""The COPY text of a batch (apps/runs/copy_text.py) read back by a reader written here from the
format's rules in Postgres's manual (the ``COPY`` page, "Text Format"), sharing no code with the
writer: every value comes back as it went in, hostile strings included."""

from __future__ import annotations

import json
import re

import pytest

from apps.runs.copy_text import copy_text, escape, gaps_json
from tests.runs.factories import observed
from workers.replay.records import GapHistogram

HOSTILE = [
    "",
    "plain",
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "crlf\r\n",
    "back\\slash",
    "\\N",  # the NULL marker as a value: must stay a string
    "\\.",  # the old end-of-data marker
    "trailing\\",
    "\\t not a tab",
    "ünïcödé 日本語 🙂",
    "\t\n\\\r",
    "quote \" and ' and {json}",
]

_UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r", "b": "\b", "f": "\f", "v": "\v"}


def _read_value(field: str) -> str | None:
    if field == "\\N":
        return None
    # Only the escapes the manual lists; an unknown one would be a writer's bug, so it fails.
    return re.sub(r"\\(.)", lambda m: _UNESCAPE[m.group(1)], field, flags=re.DOTALL)


def _read(text: str) -> list[list[str | None]]:
    assert text.endswith("\n")
    # A raw tab or newline inside a value would split it here: that is what the escaping prevents.
    return [[_read_value(f) for f in line.split("\t")] for line in text[:-1].split("\n")]


COLUMNS = (
    ("run_id", "int", False),
    ("index", "int", False),
    ("request_class", "text", False),
    ("warmup", "bool", False),
    ("sent_ns", "int", True),
    ("token_gaps", "gaps", False),
    ("error", "text", True),
    ("backend", "text", False),
)


def test_it_writes_hostile_strings_that_read_back_exactly() -> None:
    records = []
    for i, s in enumerate(HOSTILE):
        rec = observed("r", i, cls=s)
        rec.error, rec.backend = s, s[::-1]
        records.append(rec)
    rows = _read(copy_text(COLUMNS, records, {"run_id": "7"}))
    assert len(rows) == len(HOSTILE)
    for rec, row in zip(records, rows, strict=True):
        assert len(row) == len(COLUMNS)
        assert row[0] == "7" and row[1] == str(rec.index)
        assert row[2] == rec.request_class and row[6] == rec.error and row[7] == rec.backend


# Postgres's boolean type reads these (and t/f, yes/no, on/off, 1/0), case aside.
_BOOLEANS = {"True": True, "False": False}


def test_it_writes_null_only_for_none_and_booleans_as_the_boolean_type_reads_them() -> None:
    a, b = observed("r", 0), observed("r", 1)
    a.sent_ns, a.error, a.warmup = None, None, True
    b.sent_ns, b.error, b.warmup = 0, "\\N", False
    (ra, rb) = _read(copy_text(COLUMNS, [a, b], {"run_id": "1"}))
    assert (_BOOLEANS[ra[3]], ra[4], ra[6]) == (True, None, None)
    assert (_BOOLEANS[rb[3]], rb[4], rb[6]) == (False, "0", "\\N")


def test_none_in_a_text_value_is_text_and_only_a_missing_number_is_null() -> None:
    # The numbers' NULLs come from one replace of "None" over their joined text: a text value
    # spelling None, next to them or not, must come back as itself.
    rec = observed("None", 0, cls="None")
    rec.error, rec.backend, rec.sent_ns = "None of the above\tNone", "None", None
    (row,) = _read(copy_text(COLUMNS, [rec], {"run_id": "3"}))
    assert row == ["3", "0", "None", "False", None, row[5], "None of the above\tNone", "None"]


def test_the_same_rows_come_out_whatever_the_order_of_the_columns() -> None:
    records = [observed("r", i, cls=HOSTILE[i % len(HOSTILE)]) for i in range(30)]
    for i, rec in enumerate(records):
        rec.sent_ns = None if i % 3 == 0 else rec.sent_ns
        rec.error = None if i % 2 else HOSTILE[(i + 5) % len(HOSTILE)]
    grouped = sorted(range(len(COLUMNS)), key=lambda i: COLUMNS[i][1] not in ("int", "bool"))
    mine = _read(copy_text([COLUMNS[i] for i in grouped], records, {"run_id": "9"}))
    theirs = _read(copy_text(COLUMNS, records, {"run_id": "9"}))
    assert [[row[grouped.index(i)] for i in range(len(COLUMNS))] for row in mine] == theirs


def test_an_integer_columns_constant_must_be_an_integer() -> None:
    with pytest.raises(ValueError, match="run_id"):
        copy_text(COLUMNS, [observed("r", 0)], {"run_id": "1\tNone"})
    assert _read(copy_text(COLUMNS, [observed("r", 0)], {"run_id": "-12"}))[0][0] == "-12"


@pytest.mark.parametrize(
    "counts",
    [
        {},
        {253: 7.0},
        {0: 1.0, 1: 0.5, 400: 3.0},
        {5: 0.1, 6: 1e-7, 7: 1e20, 8: 2.0000000000000004},
        {9: 3},  # an int weight (GapHistogram.from_json makes floats; a caller may not)
    ],
)
def test_the_gap_histograms_json_means_what_json_dumps_of_to_json_means(counts: dict[int, float]) -> None:
    hist = GapHistogram(dict(counts))
    mine = json.loads(gaps_json(hist))
    theirs = json.loads(json.dumps(hist.to_json()))
    assert mine == theirs
    # Whole weights stay integers in the text, as to_json writes them (jsonb keeps 7 and 7.0 apart).
    assert [type(v) for v in mine.values()] == [type(v) for v in theirs.values()]
    assert gaps_json(hist) == json.dumps(hist.to_json())  # the very text, keys in the same order


def test_it_writes_each_records_own_histogram_whatever_it_wrote_before() -> None:
    # The text of a bucket is remembered per (bucket, weight): the same bucket with another
    # weight, and the same weight as an int and a float, must each come out as themselves.
    hists = [{1: 2.0}, {1: 2.5}, {1: 2}, {1: 3.0, 0: 0.25}, {1: 2.0}]
    records = []
    for i, counts in enumerate(hists):
        rec = observed("r", i)
        rec.token_gaps = GapHistogram(dict(counts))
        records.append(rec)
    rows = _read(copy_text(COLUMNS, records, {"run_id": "1"}))
    assert [json.loads(row[5]) for row in rows] == [
        {"1": 2},
        {"1": 2.5},
        {"1": 2},
        {"0": 0.25, "1": 3},
        {"1": 2},
    ]
    assert [type(json.loads(row[5])["1"]) for row in rows] == [int, float, int, int, int]


def test_escape_leaves_ordinary_text_alone() -> None:
    assert escape("short") == "short" and escape("ü 🙂") == "ü 🙂"
    assert escape("a\\b\tc\nd\re") == "a\\\\b\\tc\\nd\\re"


def test_an_empty_batch_is_no_text() -> None:
    assert copy_text(COLUMNS, [], {"run_id": "1"}) == ""
