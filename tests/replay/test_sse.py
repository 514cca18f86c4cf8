from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.replay.sse import DONE, SSEParser


def test_it_returns_every_event_of_one_read() -> None:
    parser = SSEParser()
    events = parser.feed(b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\n')
    assert events == ['{"a":1}', '{"a":2}', DONE]


def test_it_joins_a_line_split_across_reads() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"te') == []
    assert parser.feed(b'xt":"hi"}\n') == []
    assert parser.feed(b"\n") == ['{"text":"hi"}']


def test_it_skips_comments_and_other_fields() -> None:
    parser = SSEParser()
    events = parser.feed(b": keep-alive\n\nevent: message\nid: 7\nretry: 100\ndata: x\n\n:ping\n\n")
    assert events == ["x"]


def test_it_joins_multi_line_data_with_newlines() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\ndata: b\n\n") == ["a\nb"]


def test_it_accepts_crlf_even_when_split_between_cr_and_lf() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    # The "\n" completing "\r\n" must not count as the blank line that ends the event.
    assert parser.feed(b"\n") == []
    assert parser.feed(b"\r\n") == ["a"]
    assert parser.feed(b"data: b\r\rdata: c\r\n\r\n") == ["b", "c"]


def test_it_keeps_data_without_a_space_after_the_colon() -> None:
    assert SSEParser().feed(b"data:x\n\ndata:  y\n\n") == ["x", " y"]


def test_it_flushes_an_event_without_the_final_blank_line_on_close() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == []
    assert parser.close() == [DONE]
    assert parser.close() == []


def test_it_decodes_utf8_split_inside_a_character() -> None:
    payload = "data: héllo\n\n".encode()
    cut = payload.index(b"\xc3") + 1
    parser = SSEParser()
    assert parser.feed(payload[:cut]) + parser.feed(payload[cut:]) == ["héllo"]


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=10), st.booleans())
def test_it_gives_the_same_events_however_the_bytes_are_cut(cuts: list[int], crlf: bool) -> None:
    stream = b": hi\n\ndata: one\n\ndata: two\ndata: three\n\ndata: [DONE]\n\n"
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    points = sorted({min(c, len(stream)) for c in cuts})
    parser = SSEParser()
    events: list[str] = []
    start = 0
    for point in [*points, len(stream)]:
        events += parser.feed(stream[start:point])
        start = point
    events += parser.close()
    assert events == ["one", "two\nthree", DONE]
