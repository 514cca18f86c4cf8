"""The canonical trace file: JSONL, one header line then one request per line.

Pure: standard library only (and apps/workloads/corpus.py's message check). This is the
contract between workloads (which write traces), the replay client (which sends them) and
orchestration (which stores them by hash). The bytes are canonical, so ``trace_sha256`` names the
traffic exactly: ``trace_dumps(trace_loads(data)) == data`` for every file
``trace_loads`` accepts, and it refuses any file that is not spelled
canonically. The format is documented in docs/TRACES.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.workloads.corpus import CorpusError, check_messages

FORMAT = "tailtune-trace"
VERSION = 1
# Required keys of a request line; OPTIONAL_KEYS may be present.
REQUEST_KEYS = ("index", "t_offset_s", "class", "input_tokens", "output_tokens", "priority", "warmup")
OPTIONAL_KEYS = ("prompt_token_ids", "prompt", "messages", "cancel_after_tokens", "hash_ids", "scenario")
T_DECIMALS = 6


class TraceFormatError(ValueError):
    """A trace file that breaks the format; ``line`` is 1-based (the header is line 1)."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}")


@dataclass
class TraceRequest:
    index: int
    t_offset_s: float
    klass: str
    input_tokens: int
    output_tokens: int
    priority: int = 0
    warmup: bool = False
    prompt_token_ids: list[int] | None = None
    prompt: str | None = None
    # A chat request's messages (a request log's, apps/workloads/requestlog.py): sent to
    # /v1/chat/completions; input_tokens is then the chat template's rendered count.
    messages: list[dict[str, str]] | None = None
    cancel_after_tokens: int | None = None
    hash_ids: list[int] | None = None
    scenario: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "t_offset_s": round(float(self.t_offset_s), T_DECIMALS),
            "class": self.klass,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "priority": self.priority,
            "warmup": self.warmup,
        }
        for key in OPTIONAL_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass
class Trace:
    meta: dict[str, Any]
    requests: list[TraceRequest] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        """Span of planned arrivals (last minus first); 0 for fewer than two."""
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].t_offset_s - self.requests[0].t_offset_s

    def prompts(self) -> list[list[int] | str]:
        """The corpus in index order: token ids where present, else text."""
        return [
            r.prompt_token_ids if r.prompt_token_ids is not None else (r.prompt or "") for r in self.requests
        ]


def canonical_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"


def trace_dumps(trace: Trace) -> bytes:
    """The canonical bytes of a trace (what ``trace_sha256`` hashes)."""
    header = {"format": FORMAT, "version": VERSION, "meta": trace.meta}
    parts = [canonical_line(header)]
    parts.extend(canonical_line(r.to_json()) for r in trace.requests)
    return "".join(parts).encode("ascii")


def trace_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _int(obj: Mapping[str, Any], key: str, line: int, *, minimum: int | None = 0) -> int:
    value = obj[key]
    # JSON true/false parse as bool, which Python counts as int: refuse them.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(line, f"{key} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise TraceFormatError(line, f"{key} must be at least {minimum}, got {value}")
    return value


def _int_list(obj: Mapping[str, Any], key: str, line: int) -> list[int]:
    value = obj[key]
    # type() is exact: bool (a subclass of int) is refused. map/min run in C,
    # which matters for 8000-token prompts.
    if not isinstance(value, list) or not set(map(type, value)) <= {int}:
        raise TraceFormatError(line, f"{key} must be a list of integers")
    if value and min(value) < 0:
        raise TraceFormatError(line, f"{key} must not hold negative ids")
    return value


def _request(
    obj: Any, line: int, expected_index: int, previous_t: float, warmup_s: float | None
) -> TraceRequest:
    if not isinstance(obj, dict):
        raise TraceFormatError(line, "a request line must be a JSON object")
    missing = [k for k in REQUEST_KEYS if k not in obj]
    if missing:
        raise TraceFormatError(line, f"missing field(s): {', '.join(missing)}")
    unknown = sorted(set(obj) - set(REQUEST_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise TraceFormatError(line, f"unknown field(s): {', '.join(unknown)}")
    index = _int(obj, "index", line)
    if index != expected_index:
        raise TraceFormatError(
            line, f"index must be {expected_index} (requests are numbered in order), got {index}"
        )
    t = obj["t_offset_s"]
    # Always a float (0.0, never 0), so a parsed trace re-serialises to the same bytes.
    if not isinstance(t, float) or not math.isfinite(t):
        raise TraceFormatError(line, f"t_offset_s must be a finite decimal number such as 1.5, got {t!r}")
    if t < 0:
        raise TraceFormatError(line, f"t_offset_s must not be negative, got {t}")
    if t < previous_t:
        raise TraceFormatError(
            line, f"t_offset_s {t} is before the previous request's {previous_t}: not in arrival order"
        )
    klass = obj["class"]
    if not isinstance(klass, str) or not klass:
        raise TraceFormatError(line, "class must be a non-empty string")
    warmup = obj["warmup"]
    if not isinstance(warmup, bool):
        raise TraceFormatError(line, f"warmup must be true or false, got {warmup!r}")
    if warmup_s is not None and warmup != (t < warmup_s):
        raise TraceFormatError(
            line,
            f"warmup is {warmup} but t_offset_s {t} is {'inside' if t < warmup_s else 'after'} the warm-up ({warmup_s} s)",
        )
    req = TraceRequest(
        index=index,
        t_offset_s=float(t),
        klass=klass,
        input_tokens=_int(obj, "input_tokens", line, minimum=1),
        output_tokens=_int(obj, "output_tokens", line, minimum=1),
        priority=_int(obj, "priority", line, minimum=None),
        warmup=warmup,
    )
    if "prompt_token_ids" in obj:
        req.prompt_token_ids = _int_list(obj, "prompt_token_ids", line)
        if len(req.prompt_token_ids) != req.input_tokens:
            raise TraceFormatError(
                line,
                f"prompt_token_ids holds {len(req.prompt_token_ids)} tokens but input_tokens is {req.input_tokens}",
            )
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise TraceFormatError(line, "prompt must be a non-empty string")
        req.prompt = obj["prompt"]
    if "messages" in obj:
        if req.prompt_token_ids is not None or req.prompt is not None:
            raise TraceFormatError(line, "a chat request's messages go without prompt or prompt_token_ids")
        try:
            messages = check_messages(obj["messages"], line)
        except CorpusError as exc:
            raise TraceFormatError(line, exc.message) from None
        if messages != obj["messages"]:
            raise TraceFormatError(line, "messages must be {role, content[, name]} objects with text content")
        req.messages = messages
    if req.prompt_token_ids is None and req.prompt is None and req.messages is None:
        raise TraceFormatError(line, "a request needs prompt_token_ids, prompt or messages")
    if "cancel_after_tokens" in obj:
        req.cancel_after_tokens = _int(obj, "cancel_after_tokens", line)
    if "hash_ids" in obj:
        req.hash_ids = _int_list(obj, "hash_ids", line)
    if "scenario" in obj:
        if not isinstance(obj["scenario"], str):
            raise TraceFormatError(line, "scenario must be a string")
        req.scenario = obj["scenario"]
    return req


def trace_loads(data: bytes) -> Trace:
    """Parse and strictly validate canonical trace bytes.

    Every problem raises ``TraceFormatError`` naming the line. Besides the
    field checks, each line must be spelled exactly as ``trace_dumps`` would
    spell it, so an accepted file always hashes to the same trace.
    """
    if not data:
        raise TraceFormatError(1, "empty file: expected a tailtune-trace header")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceFormatError(
            line, "non-ASCII byte: canonical traces escape every non-ASCII character"
        ) from None
    if not text.endswith("\n"):
        raise TraceFormatError(text.count("\n") + 1, "the last line must end with a newline")
    lines = text[:-1].split("\n")
    objects: list[Any] = []
    for number, raw in enumerate(lines, start=1):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(number, f"not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise TraceFormatError(number, "each line must be a JSON object")
        if canonical_line(obj) != raw + "\n":
            raise TraceFormatError(
                number, "not canonical JSON (sorted keys, no spaces, ASCII, 6-decimal times)"
            )
        objects.append(obj)
    header = objects[0]
    if (
        header.get("format") != FORMAT
        or header.get("version") != VERSION
        or set(header) != {"format", "version", "meta"}
    ):
        raise TraceFormatError(
            1, f'header must be {{"format": "{FORMAT}", "version": {VERSION}, "meta": {{...}}}}'
        )
    meta = header["meta"]
    if not isinstance(meta, dict):
        raise TraceFormatError(1, "meta must be an object")
    warmup_s = meta.get("warmup_s")
    if warmup_s is not None and (isinstance(warmup_s, bool) or not isinstance(warmup_s, (int, float))):
        raise TraceFormatError(1, f"meta.warmup_s must be a number, got {warmup_s!r}")
    trace = Trace(meta=meta)
    previous = 0.0
    for number, obj in enumerate(objects[1:], start=2):
        req = _request(obj, number, number - 2, previous, warmup_s)
        if round(req.t_offset_s, T_DECIMALS) != req.t_offset_s:
            raise TraceFormatError(number, f"t_offset_s must be rounded to {T_DECIMALS} decimals")
        previous = req.t_offset_s
        trace.requests.append(req)
    return trace
