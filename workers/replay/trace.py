"""Read a canonical tailtune trace file (header line + one request per line).

The reader checks what the replay relies on (field types, arrival order,
prompt present) and names the offending line, so a bad file fails before a
single request is sent.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_FORMAT = "tailtune-trace"
TRACE_VERSION = 1

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "index": int,
    "t_offset_s": (int, float),
    "class": str,
    "input_tokens": int,
    "output_tokens": int,
}


class TraceError(ValueError):
    """The trace file is not a valid canonical trace; the message names the line."""


@dataclass
class Trace:
    header: dict[str, Any]
    requests: list[dict[str, Any]]
    sha256: str
    meta: dict[str, Any] = field(default_factory=dict)


def trace_read(*, path: str | Path, expected_sha256: str | None = None) -> Trace:
    """Parse and check a trace file; ``expected_sha256`` (if given) must match the file's bytes."""
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 and digest != expected_sha256.lower():
        raise TraceError(f"{path}: sha256 {digest} does not match the expected {expected_sha256}")
    lines = data.decode("utf-8").splitlines()
    if not lines:
        raise TraceError(f"{path}: empty file, expected a header line")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: line 1: header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("format") != TRACE_FORMAT:
        raise TraceError(f"{path}: line 1: header.format must be {TRACE_FORMAT!r}")
    if header.get("version") != TRACE_VERSION:
        raise TraceError(f"{path}: line 1: unsupported header.version {header.get('version')!r}")
    meta = header.get("meta") or {}
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: line 1: header.meta must be an object")
    requests: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: line {lineno}: not JSON: {exc}") from None
        problem = request_problem(request, position=len(requests))
        if problem:
            raise TraceError(f"{path}: line {lineno}: {problem}")
        if requests and request["t_offset_s"] < requests[-1]["t_offset_s"]:
            raise TraceError(
                f"{path}: line {lineno}: t_offset_s goes backwards (requests must be in arrival order)"
            )
        requests.append(request)
    return Trace(header=header, requests=requests, sha256=digest, meta=meta)


def request_problem(request: Any, *, position: int | None = None) -> str | None:
    """What is wrong with one request object, or None if the replay can send it."""
    if not isinstance(request, dict):
        return "request must be a JSON object"
    for name, kind in _REQUIRED.items():
        value = request.get(name)
        if value is None:
            return f"missing field {name!r}"
        if isinstance(value, bool) or not isinstance(value, kind):
            return f"field {name!r} has the wrong type ({type(value).__name__})"
    if position is not None and request["index"] != position:
        return f"index {request['index']} where {position} was expected (0-based, in order)"
    if request["t_offset_s"] < 0:
        return "t_offset_s must be >= 0"
    if request["output_tokens"] < 1:
        return "output_tokens must be >= 1"
    prompt = request.get("prompt")
    ids = request.get("prompt_token_ids")
    messages = request.get("messages")
    if prompt is None and ids is None and messages is None:
        return "needs prompt_token_ids, prompt or messages"
    if messages is not None and (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        return "field 'messages' must be a non-empty list of objects with a role"
    if prompt is not None and not isinstance(prompt, str):
        return "field 'prompt' must be a string"
    if ids is not None and (not isinstance(ids, list) or not all(type(t) is int for t in ids)):
        return "field 'prompt_token_ids' must be a list of integers"
    cancel = request.get("cancel_after_tokens")
    if cancel is not None and (isinstance(cancel, bool) or not isinstance(cancel, int) or cancel < 0):
        return "field 'cancel_after_tokens' must be a non-negative integer"
    priority = request.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        return "field 'priority' must be an integer"
    return None
