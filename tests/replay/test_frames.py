from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.replay.frames import Frame, _slow, frame_parse


def _dump(obj: object) -> str:
    # vLLM writes frames with pydantic's compact JSON; the fast path relies on no spaces.
    return json.dumps(obj, separators=(",", ":"))


def _completion_frame(text: str, completion: int, reason: str | None) -> dict[str, object]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        ],
        "usage": {"prompt_tokens": 7, "total_tokens": 7 + completion, "completion_tokens": completion},
    }


def test_it_reads_a_vllm_completion_frame() -> None:
    frame = frame_parse(_dump(_completion_frame(" hi", 3, None)))
    assert frame == Frame(3, 7, True, True, None, None)


def test_it_reads_the_closing_usage_frame() -> None:
    data = _dump(
        {"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}}
    )
    assert frame_parse(data) == Frame(9, 7, False, False, None, None)


def test_it_reads_an_error_frame() -> None:
    data = _dump({"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}})
    assert frame_parse(data).error == "engine dead"


def test_it_counts_output_of_a_chat_frame_without_usage() -> None:
    data = _dump({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "length"}]})
    assert frame_parse(data) == Frame(None, None, True, True, "length", None)


def test_it_refuses_a_frame_that_is_not_an_object() -> None:
    with pytest.raises(ValueError):
        frame_parse("[1, 2]")


# Generated text may contain anything, including what looks like the keys the fast path looks for.
_tricky = st.text(
    alphabet=st.sampled_from(['"', "\\", ":", "{", "}", "[", "]", "a", "1", " ", "é"]), max_size=20
)
_text = st.one_of(
    _tricky,
    st.sampled_from(['"completion_tokens":99', '"finish_reason":"stop"', '"choices":[]', '"error":1']),
)


@given(
    _text,
    st.integers(min_value=0, max_value=10_000),
    st.sampled_from([None, "length", "stop"]),
    st.booleans(),
)
def test_it_agrees_with_a_full_json_parse(text: str, completion: int, reason: str | None, chat: bool) -> None:
    obj = _completion_frame(text, completion, reason)
    if chat:
        obj["choices"] = [{"index": 0, "delta": {"content": text}, "finish_reason": reason}]
    data = _dump(obj)
    fast = frame_parse(data)
    slow = _slow(data)
    assert fast.completion_tokens == slow.completion_tokens == completion
    assert fast.finish_reason == slow.finish_reason == reason
    assert fast.has_choices == slow.has_choices
    assert fast.prompt_tokens == slow.prompt_tokens == 7
