"""What the load generator needs from one OpenAI-compatible stream frame.

A busy replay reads tens of thousands of frames a second, and a full
``json.loads`` of each was a third of the client's CPU. The fields needed
(cumulative ``completion_tokens``, ``finish_reason``, whether ``choices`` is
empty, an ``error``) can be found by substring search: inside a JSON string
every quote is escaped, so ``"completion_tokens":`` can only be a key, never
generated text. Any frame the fast path is not sure about (no usage, an
error, unusual spacing) goes through ``json.loads``.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

_COMPLETION = '"completion_tokens":'
_PROMPT = '"prompt_tokens":'
_FINISH = '"finish_reason":'


class Frame(NamedTuple):
    # Cumulative completion tokens reported by this frame's usage, if any.
    completion_tokens: int | None
    prompt_tokens: int | None
    # The frame has at least one choice (a token frame, not the closing usage frame).
    has_choices: bool
    # The first choice carries generated output (used when usage is absent).
    has_output: bool
    finish_reason: str | None
    error: str | None


def frame_parse(data: str) -> Frame:
    """Interpret one SSE data payload (not ``[DONE]``); raises ValueError if it is not a JSON object."""
    fast = _fast(data)
    return fast if fast is not None else _slow(data)


def _int_after(data: str, key: str) -> int | None:
    at = data.find(key)
    if at < 0:
        return None
    start = at + len(key)
    end = start
    length = len(data)
    while end < length and data[end].isdigit():
        end += 1
    if end == start:
        return None
    return int(data[start:end])


def _fast(data: str) -> Frame | None:
    if '"error":' in data:
        return None
    completion = _int_after(data, _COMPLETION)
    if completion is None:
        return None
    empty = '"choices":[]' in data
    if not empty and '"choices":[{' not in data:
        return None
    reason: str | None = None
    at = data.find(_FINISH)
    if at >= 0:
        start = at + len(_FINISH)
        if data.startswith('"', start):
            end = data.find('"', start + 1)
            if end < 0:
                return None
            reason = data[start + 1 : end]
        elif not data.startswith("null", start):
            return None
    # has_output only matters without usage, which never takes this path.
    return Frame(completion, _int_after(data, _PROMPT), not empty, not empty, reason, None)


def _slow(data: str) -> Frame:
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError(f"stream frame is not a JSON object: {data[:100]}")
    error = obj.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        return Frame(None, None, False, False, None, str(message))
    choices = obj.get("choices") or ()
    first: dict[str, Any] = choices[0] if choices and isinstance(choices[0], dict) else {}
    usage = obj.get("usage") or {}
    completion = usage.get("completion_tokens")
    prompt = usage.get("prompt_tokens")
    return Frame(
        completion if isinstance(completion, int) else None,
        prompt if isinstance(prompt, int) else None,
        bool(choices),
        _has_output(first),
        first.get("finish_reason"),
        None,
    )


def _has_output(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return bool(
        isinstance(delta, dict)
        and (delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    )
