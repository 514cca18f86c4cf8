"""Strict parsers for public LLM-serving traces, and the cuts made on them.

Pure: standard library and numpy. Every parser reads the whole file before
anything is used and raises ``TraceImportError`` naming the line of the first
problem, so a bad file yields nothing. Rows out of time order are the one
documented repair: they are sorted (stably) and the repair is reported.

Formats:

- ``azure``: Azure LLM inference trace CSV, header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``; 2023 files carry 7 fractional
  digits and no zone, 2024 files ``+00:00``. Times are parsed exactly (integer
  nanoseconds), not through ``datetime`` (which keeps only microseconds).
- ``burstgpt``: BurstGPT CSV with ``Timestamp,Model,Request tokens,Response
  tokens,Total tokens,Log Type`` (newer files add ``Session ID`` and
  ``Elapsed time``), columns matched by name. Timestamps are seconds. A row
  with 0 response tokens is a failed request: kept, flagged, counted.
- ``mooncake``: Mooncake JSONL, ``timestamp`` in ms from the start,
  ``input_length``, ``output_length``, ``hash_ids`` (512-token blocks; equal
  ids mean a shared prefix, kept).
- ``vllm-timed``: the JSONL read by ``vllm bench serve --dataset-name
  timed_trace`` (vllm/benchmarks/datasets/datasets.py ``TimedTrace``): the
  same keys, ``timestamp`` times ``--timed-trace-sec-multiplier`` (default 1,
  seconds) and ``hash_ids`` of ``--timed-trace-chunk-hash-size`` (default 16)
  token blocks, ``hash_ids`` optional.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from apps.workloads.stats import busiest_start

FORMATS = ("azure", "burstgpt", "mooncake", "vllm-timed")
# Refused before reading: public traces are tens of MB; a multi-GB upload is
# a mistake or an attack, and parsing it would hold the worker for minutes.
DEFAULT_MAX_BYTES = 512 * 1024 * 1024

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURSTGPT_REQUIRED = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
BURSTGPT_OPTIONAL = ("Session ID", "Elapsed time")
MOONCAKE_BLOCK_TOKENS = 512
VLLM_TIMED_BLOCK_TOKENS = 16

_TIMESTAMP = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})?$"
)
_UINT = re.compile(r"^\d+$")
_DECIMAL = re.compile(r"^\d+(?:\.\d*)?(?:[eE][+-]?\d+)?$")
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


class TraceImportError(ValueError):
    """A trace file that cannot be imported; ``line`` is 1-based, None for the whole file."""

    def __init__(self, line: int | None, message: str) -> None:
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


@dataclass
class ImportedTrace:
    """Rows of a real trace in arrival order, times in seconds from ``t_s[0]`` or the window start."""

    source_format: str
    t_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    failed: np.ndarray
    source_lines: np.ndarray
    hash_ids: list[list[int]] | None = None
    block_tokens: int | None = None
    repairs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    window: dict[str, float] | None = None
    speed: float = 1.0
    capped_rows: int = 0

    def __len__(self) -> int:
        return len(self.t_s)

    def take(self, index: np.ndarray) -> ImportedTrace:
        """The rows at ``index`` (an int array), everything else carried over."""
        return replace(
            self,
            t_s=self.t_s[index],
            input_tokens=self.input_tokens[index],
            output_tokens=self.output_tokens[index],
            failed=self.failed[index],
            source_lines=self.source_lines[index],
            hash_ids=[self.hash_ids[i] for i in index] if self.hash_ids is not None else None,
            repairs=list(self.repairs),
            notes=list(self.notes),
        )


def _human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def check_size(size: int, *, max_bytes: int = DEFAULT_MAX_BYTES, name: str = "file") -> None:
    """Refuse a trace larger than ``max_bytes``; call it with an upload's declared size before reading it."""
    if size > max_bytes:
        raise TraceImportError(
            None,
            f"{name} is {_human_bytes(size)}, over the {_human_bytes(max_bytes)} import limit; nothing was read",
        )


def read_trace_file(
    path: str | Path,
    *,
    fmt: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    sec_multiplier: float = 1.0,
    block_tokens: int = VLLM_TIMED_BLOCK_TOKENS,
) -> ImportedTrace:
    """Check the size cap on disk, then read and parse the file."""
    check_size(os.stat(path).st_size, max_bytes=max_bytes, name=str(path))
    return parse_trace_bytes(
        Path(path).read_bytes(),
        fmt=fmt,
        max_bytes=max_bytes,
        sec_multiplier=sec_multiplier,
        block_tokens=block_tokens,
    )


def parse_trace_bytes(
    data: bytes,
    *,
    fmt: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    sec_multiplier: float = 1.0,
    block_tokens: int = VLLM_TIMED_BLOCK_TOKENS,
) -> ImportedTrace:
    """Parse a whole trace held in memory (an upload); ``sec_multiplier`` and ``block_tokens`` apply to vllm-timed."""
    if fmt not in FORMATS:
        raise TraceImportError(None, f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    check_size(len(data), max_bytes=max_bytes, name="upload")
    lines = _lines(data)
    if fmt == "azure":
        return _parse_azure(lines)
    if fmt == "burstgpt":
        return _parse_burstgpt(lines)
    if fmt == "mooncake":
        return _parse_jsonl(lines, fmt=fmt, sec_multiplier=0.001, block_tokens=MOONCAKE_BLOCK_TOKENS)
    if not (math.isfinite(sec_multiplier) and sec_multiplier > 0):
        raise TraceImportError(None, f"sec_multiplier must be positive, got {sec_multiplier!r}")
    if block_tokens < 1:
        raise TraceImportError(None, f"block_tokens must be positive, got {block_tokens!r}")
    return _parse_jsonl(lines, fmt=fmt, sec_multiplier=sec_multiplier, block_tokens=block_tokens)


def _lines(data: bytes) -> list[str]:
    """Decoded lines (CRLF or LF), trailing blank lines dropped; an empty file is an error."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceImportError(data[: exc.start].count(b"\n") + 1, "not valid UTF-8") from None
    # split("\n"), not splitlines(): a stray form feed or U+2028 inside a field
    # must not shift every later line number.
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise TraceImportError(1, "empty file")
    return lines


def _uint(value: str, line: int, column: str) -> int:
    value = value.strip()
    if _UINT.match(value):
        return int(value)
    if value.startswith("-") and _DECIMAL.match(value[1:]):
        raise TraceImportError(line, f"{column} must not be negative, got {value!r}")
    raise TraceImportError(line, f"{column} must be a whole number, got {value!r}")


def _seconds(value: str, line: int, column: str) -> float:
    value = value.strip()
    if _DECIMAL.match(value):
        result = float(value)
        if math.isfinite(result):
            return result
    if value.startswith("-") and _DECIMAL.match(value[1:]):
        raise TraceImportError(line, f"{column} must not be negative, got {value!r}")
    raise TraceImportError(line, f"{column} must be a number of seconds, got {value!r}")


def _timestamp_ns(value: str, line: int) -> tuple[int, bool]:
    """(nanoseconds since the Unix epoch, whether a zone was given) for an ISO-like timestamp."""
    m = _TIMESTAMP.match(value.strip())
    if not m:
        raise TraceImportError(line, f"TIMESTAMP {value!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]'")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        ordinal = dt.date(year, month, day).toordinal()
    except ValueError as exc:
        raise TraceImportError(line, f"TIMESTAMP {value!r}: {exc}") from None
    if hour > 23 or minute > 59 or second > 59:
        raise TraceImportError(line, f"TIMESTAMP {value!r}: time of day out of range")
    fraction = (m.group(7) or "").ljust(9, "0")
    ns = ((ordinal - _EPOCH_ORDINAL) * 86400 + hour * 3600 + minute * 60 + second) * 10**9 + int(
        fraction or 0
    )
    zone = m.group(8)
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        ns -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * 10**9
    return ns, zone is not None


def _finish(
    fmt: str,
    t_s: Sequence[float] | np.ndarray,
    inputs: Sequence[int],
    outputs: Sequence[int],
    lines: Sequence[int],
    *,
    failed: Sequence[bool] | None = None,
    hash_ids: list[list[int]] | None = None,
    block_tokens: int | None = None,
) -> ImportedTrace:
    if not len(lines):
        raise TraceImportError(1, "no data rows")
    t = np.asarray(t_s, dtype=np.float64)
    trace = ImportedTrace(
        source_format=fmt,
        t_s=t,
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        failed=np.asarray(failed if failed is not None else np.zeros(len(t), dtype=bool), dtype=bool),
        source_lines=np.asarray(lines, dtype=np.int64),
        hash_ids=hash_ids,
        block_tokens=block_tokens,
    )
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        order = np.argsort(t, kind="stable")
        moved = int(np.count_nonzero(order != np.arange(len(t))))
        first = int(trace.source_lines[back[0] + 1])
        trace = trace.take(order)
        trace.repairs.append(
            f"sorted rows by arrival time: {moved} rows moved, first out of order at line {first}"
        )
    # Offsets from the first arrival: the absolute epoch stays in the notes.
    trace.t_s = trace.t_s - trace.t_s[0]
    return trace


def _parse_azure(lines: list[str]) -> ImportedTrace:
    header = lines[0].strip()
    if header != AZURE_HEADER:
        raise TraceImportError(1, f"header must be {AZURE_HEADER!r}, got {header[:80]!r}")
    ns: list[int] = []
    inputs: list[int] = []
    outputs: list[int] = []
    numbers: list[int] = []
    zoned: bool | None = None
    for number, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            raise TraceImportError(number, "empty line inside the data")
        cells = raw.split(",")
        if len(cells) != 3:
            raise TraceImportError(number, f"expected 3 comma-separated fields, got {len(cells)}")
        t, has_zone = _timestamp_ns(cells[0], number)
        if zoned is None:
            zoned = has_zone
        elif has_zone != zoned:
            raise TraceImportError(number, "TIMESTAMP zone suffix differs from the first row's: mixed file")
        ns.append(t)
        inputs.append(_uint(cells[1], number, "ContextTokens"))
        outputs.append(_uint(cells[2], number, "GeneratedTokens"))
        numbers.append(number)
    if not numbers:
        raise TraceImportError(1, "no data rows after the header")
    # Integer nanoseconds relative to the earliest row keep full precision in float64.
    origin = min(ns)
    trace = _finish("azure", [(v - origin) / 1e9 for v in ns], inputs, outputs, numbers)
    trace.notes.append(f"first arrival {dt.datetime.fromtimestamp(origin // 10**9, dt.UTC).isoformat()}")
    return trace


def _parse_burstgpt(lines: list[str]) -> ImportedTrace:
    rows = csv.reader(lines)
    try:
        header = [h.strip() for h in next(rows)]
    except csv.Error as exc:
        raise TraceImportError(1, f"bad CSV: {exc}") from None
    missing = [c for c in BURSTGPT_REQUIRED if c not in header]
    unknown = [c for c in header if c not in BURSTGPT_REQUIRED + BURSTGPT_OPTIONAL]
    if missing or unknown or len(set(header)) != len(header):
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown {', '.join(repr(u) for u in unknown)}")
        if len(set(header)) != len(header):
            problems.append("duplicate columns")
        raise TraceImportError(1, f"BurstGPT header: {'; '.join(problems)}")
    col = {name: i for i, name in enumerate(header)}
    t_s: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    numbers: list[int] = []
    number = 1
    try:
        for cells in rows:
            number = rows.line_num
            if not cells or not any(c.strip() for c in cells):
                raise TraceImportError(number, "empty line inside the data")
            if len(cells) != len(header):
                raise TraceImportError(number, f"expected {len(header)} fields, got {len(cells)}")
            t_s.append(_seconds(cells[col["Timestamp"]], number, "Timestamp"))
            inputs.append(_uint(cells[col["Request tokens"]], number, "Request tokens"))
            outputs.append(_uint(cells[col["Response tokens"]], number, "Response tokens"))
            _uint(cells[col["Total tokens"]], number, "Total tokens")
            if "Elapsed time" in col and cells[col["Elapsed time"]].strip():
                _seconds(cells[col["Elapsed time"]], number, "Elapsed time")
            numbers.append(number)
    except csv.Error as exc:
        raise TraceImportError(rows.line_num, f"bad CSV: {exc}") from None
    failed = [o == 0 for o in outputs]
    trace = _finish("burstgpt", t_s, inputs, outputs, numbers, failed=failed)
    count = int(trace.failed.sum())
    if count:
        trace.notes.append(f"{count} failed requests (0 response tokens) kept and flagged")
    return trace


def _json_uint(obj: dict, key: str, line: int) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceImportError(line, f"{key} must be a whole number, got {value!r}")
    if value < 0:
        raise TraceImportError(line, f"{key} must not be negative, got {value}")
    return value


def _parse_jsonl(lines: list[str], *, fmt: str, sec_multiplier: float, block_tokens: int) -> ImportedTrace:
    t_s: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    numbers: list[int] = []
    hashes: list[list[int]] = []
    any_hashes = False
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            raise TraceImportError(number, "empty line inside the data")
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceImportError(number, f"not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise TraceImportError(number, "each line must be a JSON object")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
        if missing:
            raise TraceImportError(number, f"missing field(s): {', '.join(missing)}")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise TraceImportError(number, f"timestamp must be a number, got {ts!r}")
        if ts < 0:
            raise TraceImportError(number, f"timestamp must not be negative, got {ts}")
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or any(
            isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in ids
        ):
            raise TraceImportError(number, "hash_ids must be a list of non-negative integers")
        any_hashes = any_hashes or bool(ids)
        t_s.append(ts * sec_multiplier)
        inputs.append(_json_uint(obj, "input_length", number))
        outputs.append(_json_uint(obj, "output_length", number))
        hashes.append(ids)
        numbers.append(number)
    return _finish(
        fmt,
        t_s,
        inputs,
        outputs,
        numbers,
        hash_ids=hashes if any_hashes else None,
        block_tokens=block_tokens if any_hashes else None,
    )


def select_window(trace: ImportedTrace, *, start_s: float, length_s: float) -> ImportedTrace:
    """Rows arriving in [start_s, start_s + length_s), times re-based to the window start."""
    if start_s < 0 or not length_s > 0:
        raise TraceImportError(None, f"window needs start_s >= 0 and length_s > 0, got {start_s}, {length_s}")
    keep = np.flatnonzero((trace.t_s >= start_s) & (trace.t_s < start_s + length_s))
    if not len(keep):
        raise TraceImportError(None, f"no arrivals in the window [{start_s}, {start_s + length_s}) s")
    out = trace.take(keep)
    out.t_s = out.t_s - start_s
    out.window = {"start_s": float(start_s), "length_s": float(length_s)}
    return out


def busiest_window(trace: ImportedTrace, *, length_s: float) -> ImportedTrace:
    """The window of ``length_s`` opened by an arrival that holds the most rows."""
    if not length_s > 0:
        raise TraceImportError(None, f"length_s must be positive, got {length_s}")
    best, _ = busiest_start(trace.t_s, length_s)
    return select_window(trace, start_s=float(trace.t_s[best]), length_s=length_s)


def scale_time(trace: ImportedTrace, *, speed: float) -> ImportedTrace:
    """Replay at ``speed`` x: every offset divided by ``speed`` (2 = twice the rate)."""
    if not (math.isfinite(speed) and speed > 0):
        raise TraceImportError(None, f"speed must be positive, got {speed!r}")
    out = trace.take(np.arange(len(trace)))
    out.t_s = trace.t_s / speed
    out.speed = trace.speed * speed
    return out


def cap_to_context(trace: ImportedTrace, *, max_model_len: int) -> ImportedTrace:
    """Fit every row into the model's context; ``capped_rows`` counts the rows changed.

    Output is kept (it is what the request asks for) unless it alone fills
    the context, then it keeps ``max_model_len - 1``; input is cut to what
    is left, at least 1.
    """
    if max_model_len < 2:
        raise TraceImportError(None, f"max_model_len must be at least 2, got {max_model_len}")
    out = trace.take(np.arange(len(trace)))
    outputs = np.minimum(trace.output_tokens, max_model_len - 1)
    inputs = np.minimum(trace.input_tokens, max_model_len - outputs)
    changed = (outputs != trace.output_tokens) | (inputs != trace.input_tokens)
    out.output_tokens = outputs
    out.input_tokens = inputs
    out.capped_rows = trace.capped_rows + int(changed.sum())
    return out


def assign_classes(input_tokens: np.ndarray, thresholds: Sequence[tuple[str, int | None]]) -> list[str]:
    """Class per row: the first (name, max_input_tokens) whose bound holds; None is unbounded.

    ``[("short", 1024), ("long", None)]`` gives "short" for input <= 1024.
    """
    if not thresholds:
        raise TraceImportError(None, "class thresholds must name at least one class")
    if thresholds[-1][1] is not None:
        raise TraceImportError(
            None, "the last class threshold must be unbounded (None) so every row has a class"
        )
    given = [b for _, b in thresholds[:-1]]
    bounds = [b for b in given if b is not None]
    if len(bounds) != len(given) or bounds != sorted(bounds):
        raise TraceImportError(None, "class thresholds must increase, with only the last unbounded")
    index = np.searchsorted(np.asarray(bounds, dtype=np.int64), np.asarray(input_tokens), side="left")
    names = [name for name, _ in thresholds]
    return [names[i] for i in index]


def parse_class_thresholds(text: str) -> list[tuple[str, int | None]]:
    """``short:1024,long`` -> [("short", 1024), ("long", None)]: the last class takes the rest."""
    out: list[tuple[str, int | None]] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        name, _, limit = part.partition(":")
        if not name:
            raise ValueError(f"classes item {i + 1}: a class name is required")
        if limit:
            try:
                out.append((name, int(limit)))
            except ValueError:
                raise ValueError(f"classes item {i + 1}: {limit!r} is not a token count") from None
        else:
            out.append((name, None))
    if not out or out[-1][1] is not None:
        raise ValueError("classes: the last class must have no limit (it takes every longer input)")
    return out
