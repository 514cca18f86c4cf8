"""The spec's ``baseline.capture``: the record of where B0 was captured, when, and the digest of
what was read (apps/experiments/baseline_capture.py writes it; docs/SPEC.md, "Capturing B0").

Pure: no Django. A spec without the record has a B0 typed by hand, which the results page and
the rollback manifest say (:func:`b0_origin`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from apps.experiments.spec_checker import _Checker, _encodable
from apps.experiments.spec_types import BaselineCapture

# Where B0 can be captured from (docs/SPEC.md, "Capturing B0").
CAPTURE_SOURCES = ("server", "command", "kubernetes", "helm", "manifest")
CAPTURE_KEYS = frozenset({"source", "name", "captured_at", "sha256", "vllm_version", "notes"})
TYPED_BY_HAND = "B0 typed by hand"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_NOTES = 20


def check_capture(c: _Checker, raw: Any, path: str = "baseline.capture") -> BaselineCapture | None:
    """The record, checked field by field; None when the spec has none."""
    if raw is None:
        return None
    data = c.mapping(raw, path)
    if not data:
        return None
    c.unknown(data, CAPTURE_KEYS, path)
    source = data.get("source")
    if source not in CAPTURE_SOURCES:
        c.fail(f"{path}.source", f"must be one of {', '.join(CAPTURE_SOURCES)}, got {source!r:.60}")
    name = c.text(data, "name", path, max_length=300)
    sha = data.get("sha256")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        c.fail(f"{path}.sha256", "must be the 64 lowercase hex digits of a sha256")
    at = data.get("captured_at")
    when = ""
    if isinstance(at, dt.datetime):  # YAML reads an unquoted timestamp as a datetime
        parsed: dt.datetime | None = at
    else:
        try:
            parsed = dt.datetime.fromisoformat(at) if isinstance(at, str) else None
        except ValueError:
            parsed = None
    if parsed is None or parsed.tzinfo is None:
        c.fail(
            f"{path}.captured_at",
            "must be an ISO 8601 time with its UTC offset, e.g. 2025-01-31T09:00:00+00:00",
        )
    else:
        when = parsed.isoformat()
    record: BaselineCapture = {
        "source": str(source),
        "name": name,
        "captured_at": when,
        "sha256": str(sha),
    }
    version = c.text(data, "vllm_version", path, required=False, max_length=64)
    if version:
        record["vllm_version"] = version
    notes = data.get("notes")
    if notes is not None:
        if (
            not isinstance(notes, list)
            or len(notes) > MAX_NOTES
            or not all(
                isinstance(n, str) and len(n) <= 1000 and "\x00" not in n and _encodable(n) for n in notes
            )
        ):
            c.fail(
                f"{path}.notes", f"must be a list of at most {MAX_NOTES} lines of text (1000 characters each)"
            )
        else:
            record["notes"] = [n for n in notes if n]
    return record


def b0_origin(baseline: Mapping[str, Any] | None) -> str:
    """One line saying where B0 came from: its capture, or that it was typed by hand."""
    capture = (baseline or {}).get("capture")
    if not isinstance(capture, Mapping) or not capture.get("sha256"):
        return TYPED_BY_HAND
    return (
        f"B0 captured from {capture.get('source')} {capture.get('name')} at {capture.get('captured_at')} "
        f"(sha256 {str(capture.get('sha256'))[:12]}…)"
    )
