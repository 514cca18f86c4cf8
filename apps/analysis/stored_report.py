"""A decision's stored report as the results page and the API read it: fast, and never stale.

The report of a seed sweep is 1.6 MB of JSON. Loading it through the model costs Postgres the
jsonb-to-text conversion (~20 ms) and Python's json module the parse (~21 ms), on every load of
the results page and of the API's report. Here:

- the decision row comes without its report, with its row version (Postgres's ``xmin``, new on
  every write of the row, whoever writes it; the embedded SQLite default has none, and keeps
  nothing);
- the report's JSON text is kept per process, by (decision, row version), for the last few
  decisions: a report is evidence and never changes in place, and a new analysis is a new row
  version, so a cached text is never served for another report;
- each load parses the text with orjson (about 4x faster than json here; large integers orjson
  refuses go through json); every load gets its own objects, so no caller can change another's.

The API sends the text itself (``report_text``): the same JSON, not re-encoded.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import orjson
from django.db import connection
from django.db.models.expressions import RawSQL

from apps.analysis.models import Decision

# Reports kept per process: a seed sweep's text is 1.6 MB.
KEEP = 6
_texts: OrderedDict[tuple[int, str], bytes] = OrderedDict()
_lock = threading.Lock()


def decision_of(experiment_id: int) -> Decision | None:
    """The experiment's decision without its report (``report_of`` and ``report_text`` read it),
    annotated with its row version."""
    qs = Decision.objects.filter(experiment_id=experiment_id).defer("report")
    if connection.vendor == "postgresql":
        # The writing transaction and the tuple's place: every write of the row makes a new tuple,
        # so the pair is new even for two writes in one transaction.
        qs = qs.annotate(row_version=RawSQL("xmin::text || '/' || ctid::text", []))
    return qs.first()


def _version(decision: Decision) -> str | None:
    version = getattr(decision, "row_version", None)
    return str(version) if version is not None else None


def report_text(decision: Decision) -> bytes:
    """The stored report's JSON text ("{}" when there is none)."""
    version = _version(decision)
    key = (decision.pk, version or "")
    if version is not None:
        with _lock:
            text = _texts.get(key)
            if text is not None:
                _texts.move_to_end(key)
                return text
    with connection.cursor() as cursor:
        table = connection.ops.quote_name(Decision._meta.db_table)
        cursor.execute(f"SELECT CAST(report AS TEXT) FROM {table} WHERE id = %s", [decision.pk])  # noqa: S608 - name is ours
        row = cursor.fetchone()
    text = (row[0] if row and row[0] else "{}").encode()
    if version is not None:
        with _lock:
            _texts[key] = text
            _texts.move_to_end(key)
            while len(_texts) > KEEP:
                _texts.popitem(last=False)
    return text


def report_of(decision: Decision) -> dict[str, Any]:
    """The stored report, parsed anew for this caller."""
    text = report_text(decision)
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:  # an integer beyond 64 bits: json reads it
        parsed = json.loads(text)
    return parsed if isinstance(parsed, dict) else {}


def forget() -> None:
    """Drop every kept text (tests)."""
    with _lock:
        _texts.clear()
