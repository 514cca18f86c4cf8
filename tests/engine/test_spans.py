"""The span receiver and the join of the server's spans to the records (workers/engine/spans.py),
with real OTLP protobuf bodies built with opentelemetry-proto, as vLLM's exporter encodes them."""

from __future__ import annotations

import math
import socket
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from workers.engine import spans as sp
from workers.engine.spans import (
    MIN_SHARE,
    ServerSpan,
    SpanReceiver,
    SpanStore,
    collect_run_spans,
    decode_export,
    join_spans,
    replay_key,
    spans_summary,
)
from workers.replay.records import SERVER_DURATION_FIELDS, SERVER_TIMING_FIELDS, RequestRecord
from workers.replay.request import server_request_id, server_run_key

RUN = "6f1c2d3e-0000-4000-8000-00000000abcd"
OTHER_RUN = "0b9e8d7c-0000-4000-8000-00000000ef01"
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _attr(key: str, value: Any) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def export_body(*spans: tuple[str, dict[str, Any]], name: str = "llm_request") -> bytes:
    """An ExportTraceServiceRequest holding one span per (request id, attributes)."""
    body = ExportTraceServiceRequest()
    scope = body.resource_spans.add().scope_spans.add()
    for request_id, attrs in spans:
        span = scope.spans.add()
        span.name = name
        span.start_time_unix_nano = 1_700_000_000_000_000_000
        span.attributes.extend(
            [_attr("gen_ai.request.id", request_id), *(_attr(k, v) for k, v in attrs.items())]
        )
    return body.SerializeToString()


def timings(queue: float = 0.01, prefill: float = 0.05, decode: float = 0.2) -> dict[str, Any]:
    return {
        "gen_ai.latency.time_in_queue": queue,
        "gen_ai.latency.time_in_model_prefill": prefill,
        "gen_ai.latency.time_in_model_decode": decode,
        "gen_ai.latency.time_to_first_token": queue + prefill + 0.002,
        "gen_ai.latency.e2e": queue + prefill + decode + 0.003,
        "gen_ai.usage.prompt_tokens": 16,
        "gen_ai.usage.completion_tokens": 8,
    }


def completion_id(run_id: str, index: int) -> str:
    """What vLLM's completions endpoint makes of our X-Request-Id (serving.py: cmpl-<id>-<choice>)."""
    return f"cmpl-{server_request_id(run_id, index)}-0"


def record(index: int, *, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        run_id=RUN, index=index, request_class="short", warmup=False, input_tokens=16,
        expected_output_tokens=8, planned_ns=index * 1_000_000, sent_ns=index * 1_000_000,
        http_status=200 if ok else 500, error_kind=None if ok else "http",
    )  # fmt: skip


@pytest.fixture
def receiver() -> Any:
    with SpanReceiver() as r:
        yield r


def post(receiver: SpanReceiver, body: bytes, **kw: Any) -> httpx.Response:
    headers = {**PROTOBUF, **kw.pop("headers", {})}
    return httpx.post(receiver.endpoint, content=body, headers=headers, timeout=5, **kw)


# --- the receiver ---------------------------------------------------------------------------------


def test_it_listens_on_loopback_and_keeps_the_llm_request_spans_by_run_and_index(receiver) -> None:
    assert receiver.endpoint == f"http://127.0.0.1:{receiver.port}/v1/traces"
    body = export_body(
        (completion_id(RUN, 0), timings()),
        (f"chatcmpl-{server_request_id(RUN, 1)}", timings(queue=0.5)),
    )
    answer = post(receiver, body)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-protobuf"
    assert not ExportTraceServiceResponse.FromString(answer.content).HasField("partial_success")
    got = receiver.store.take(server_run_key(RUN))
    assert sorted(got) == [0, 1]
    assert got[0].queue_s == pytest.approx(0.01) and got[0].prompt_tokens == 16
    assert got[1].queue_s == pytest.approx(0.5) and got[1].request_id.startswith("chatcmpl-tt-")
    assert receiver.store.take(server_run_key(RUN)) == {}  # taken once


def test_it_drops_other_spans_and_requests_of_no_replay(receiver) -> None:
    post(receiver, export_body((completion_id(RUN, 3), timings()), name="model_load"))
    # The warm-up's and the quality probe's requests carry no X-Request-Id: vLLM makes a UUID.
    post(receiver, export_body(("cmpl-9a8b7c6d5e4f4a3b9c8d7e6f5a4b3c2d-0", timings())))
    assert receiver.store.count(server_run_key(RUN)) == 0
    assert receiver.store.foreign == 1 and receiver.store.exports == 2


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({"Content-Type": "application/json"}, b"{}", 415),  # OTLP/JSON is not served
        ({"Content-Encoding": "gzip"}, b"\x1f\x8b", 415),
        ({}, b"\xff\xff\xff\xff not protobuf", 400),
    ],
)
def test_it_refuses_a_body_it_cannot_read_with_a_4xx(receiver, headers, body, status) -> None:
    answer = post(receiver, body, headers=headers)
    assert answer.status_code == status, answer.text
    assert receiver.store.exports == 0


def test_it_refuses_other_paths_and_methods(receiver) -> None:
    base = f"http://127.0.0.1:{receiver.port}"
    assert httpx.post(base + "/v1/metrics", content=b"", headers=PROTOBUF).status_code == 404
    assert httpx.get(receiver.endpoint).status_code == 405
    assert httpx.request("PATCH", receiver.endpoint).status_code == 405
    assert httpx.request("BREW", receiver.endpoint).status_code == 405


def test_it_refuses_a_body_without_a_length_or_over_its_limit() -> None:
    with SpanReceiver(max_body_bytes=64) as small:
        big = export_body(*[(completion_id(RUN, i), timings()) for i in range(5)])
        assert len(big) > 64
        assert post(small, big).status_code == 413

        def chunks():  # no Content-Length: chunked transfer
            yield big[:10]
            yield big[10:]

        assert httpx.post(small.endpoint, content=chunks(), headers=PROTOBUF).status_code == 411
        for length in (b"\xb2", b"-1", b"12a"):  # a superscript two is a digit to str.isdigit
            assert _raw_status(small, b"Content-Length: " + length) == 400, length
        assert small.store.exports == 0


def _raw_status(receiver: SpanReceiver, header: bytes) -> int:
    """The status of a POST written byte by byte with ``header`` (httpx sends ASCII headers only)."""
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + header
            + b"\r\n\r\n"
        )
        return int(sock.recv(64).split(b" ")[1])


def test_it_keeps_at_most_max_spans_and_says_how_many_it_rejected() -> None:
    with SpanReceiver(max_spans=3) as full:
        answer = post(full, export_body(*[(completion_id(RUN, i), timings()) for i in range(5)]))
        assert answer.status_code == 200
        partial = ExportTraceServiceResponse.FromString(answer.content).partial_success
        assert partial.rejected_spans == 2 and "at most 3" in partial.error_message
        assert full.store.count(server_run_key(RUN)) == 3 and full.store.rejected == 2
        full.store.take(server_run_key(RUN))  # a run takes its own: room again
        assert post(full, export_body((completion_id(RUN, 9), timings()))).status_code == 200
        assert full.store.count(server_run_key(RUN)) == 1


def test_it_listens_on_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        SpanReceiver(host="0.0.0.0")


def test_it_is_closed_once_and_answers_no_more() -> None:
    receiver = SpanReceiver()
    receiver.start()
    endpoint = receiver.endpoint
    receiver.close()
    receiver.close()
    with pytest.raises(httpx.ConnectError):
        httpx.post(endpoint, content=b"", headers=PROTOBUF, timeout=2)


# --- decoding and ids -----------------------------------------------------------------------------


def test_it_reads_each_timing_as_the_span_gives_it() -> None:
    [span], other = decode_export(export_body((completion_id(RUN, 4), timings(0.25, 0.5, 1.0))))
    assert other == 0
    assert span.timings() == {
        "server_queue_ns": 250_000_000,
        "server_prefill_ns": 500_000_000,
        "server_decode_ns": 1_000_000_000,
        "server_ttft_ns": 752_000_000,
        "server_e2e_ns": 1_753_000_000,
    }
    assert tuple(span.timings()) == SERVER_DURATION_FIELDS
    with pytest.raises(ValueError, match="not an OTLP ExportTraceServiceRequest"):
        decode_export(b"\x0a\xff")


def test_a_duration_that_is_none_negative_or_not_a_number_is_none() -> None:
    span = ServerSpan(request_id="x", queue_s=-1.2, prefill_s=math.nan, decode_s=None, ttft_s=0.0, e2e_s=2.0)
    assert span.timings() == {
        "server_queue_ns": None,
        "server_prefill_ns": None,
        "server_decode_ns": None,
        "server_ttft_ns": 0,
        "server_e2e_ns": 2_000_000_000,
    }


@pytest.mark.parametrize(
    ("request_id", "expected"),
    [
        (completion_id(RUN, 12), (server_run_key(RUN), 12)),
        (f"chatcmpl-{server_request_id(RUN, 7)}", (server_run_key(RUN), 7)),
        (server_request_id("run-1", 3), ("run_1", 3)),  # as sent, no prefix
        ("cmpl-9a8b7c6d-0", None),
        ("cmpl-tt--4-0", None),
    ],
)
def test_it_reads_the_run_and_index_from_the_id_the_server_reports(request_id, expected) -> None:
    assert replay_key(request_id) == expected


def test_a_run_id_becomes_one_header_token_with_no_dash() -> None:
    assert server_request_id(RUN, 5) == f"tt-{RUN.replace('-', '_')}-5"
    assert server_request_id("a b\r\nX: y", 1) == "tt-a_b__X:_y-1"  # no CR, LF or space


# --- the join -------------------------------------------------------------------------------------


def _store_with(*ids: str) -> SpanStore:
    store = SpanStore()
    store.add(decode_export(export_body(*[(i, timings()) for i in ids]))[0])
    return store


def test_the_join_writes_each_span_onto_its_record_and_counts_the_share() -> None:
    records = [record(i) for i in range(20)]
    store = _store_with(*[completion_id(RUN, i) for i in range(19)])  # no span of request 19
    join = join_spans(records, store.take(server_run_key(RUN)))
    assert (join.received, join.joined, join.answered) == (19, 19, 20)
    assert join.share == pytest.approx(0.95)
    assert records[0].server_queue_ns == 10_000_000 and records[0].server_prefill_ns == 50_000_000
    assert all(getattr(records[19], name) is None for name in SERVER_TIMING_FIELDS)
    summary = spans_summary(join)
    assert summary["used"] is True and summary["share"] == pytest.approx(0.95)
    assert summary["min_share"] == MIN_SHARE == 0.95 and summary["source"] == "otlp"


def test_the_join_moves_the_servers_arrivals_and_first_tokens_onto_the_replays_clock() -> None:
    # The server's wall clock is far from the replay's origin; requests sent 0, 5 and 10 ms after
    # it reached the server 0.2, 0.1 and 9.0 ms after their send (the last behind a stalled loop).
    wall = 1_700_000_000_000_000_000
    spans = {
        i: ServerSpan(request_id=completion_id(RUN, i), ttft_s=ttft, arrival_unix_ns=wall + arrival)
        for i, (arrival, ttft) in enumerate([(200_000, 0.030), (5_100_000, 0.040), (19_000_000, None)])
    }
    records = [record(0), record(1), record(2)]
    for r, sent in zip(records, (0, 5_000_000, 10_000_000), strict=True):
        r.sent_ns = sent
    join_spans(records, spans)
    # The quickest (request 1: 0.1 ms) sets the move; every arrival is then at or after its send.
    assert [r.server_arrival_ns for r in records] == [100_000, 5_000_000, 18_900_000]
    assert records[0].server_first_token_ns == 100_000 + 30_000_000
    assert records[1].server_first_token_ns == 5_000_000 + 40_000_000
    assert records[2].server_first_token_ns is None  # no TTFT in its span
    unsent = record(3)
    unsent.sent, unsent.sent_ns = False, None
    join_spans([unsent], {3: ServerSpan(request_id="x", ttft_s=0.01, arrival_unix_ns=wall)})
    assert unsent.server_arrival_ns is None and unsent.server_first_token_ns is None


def test_it_reads_the_spans_start_as_the_servers_arrival() -> None:
    [span], _ = decode_export(export_body((completion_id(RUN, 0), timings())))
    assert span.arrival_unix_ns == 1_700_000_000_000_000_000


def test_a_join_under_the_minimum_share_is_not_used_and_says_why() -> None:
    records = [record(i) for i in range(20)]
    store = _store_with(*[completion_id(RUN, i) for i in range(18)])
    summary = spans_summary(join_spans(records, store.take(server_run_key(RUN))))
    assert summary["used"] is False and summary["joined"] == 18 and summary["answered"] == 20
    assert "cover 18 of 20 answered requests (90.0%), under the 95%" in summary["reason"]
    assert "per run, not per request" in summary["reason"]


def test_only_answered_requests_count_towards_the_share() -> None:
    records = [record(0), record(1), record(2, ok=False)]
    store = _store_with(completion_id(RUN, 0), completion_id(RUN, 1), completion_id(RUN, 2))
    join = join_spans(records, store.take(server_run_key(RUN)))
    assert (join.joined, join.answered, join.share) == (2, 2, 1.0)
    assert records[2].server_e2e_ns is not None  # its span is kept on it all the same


def test_a_second_span_of_one_request_is_dropped_and_counted() -> None:
    store = _store_with(completion_id(RUN, 0), completion_id(RUN, 0), f"chatcmpl-{server_request_id(RUN, 0)}")
    assert store.duplicates == 2
    assert join_spans([record(0)], store.take(server_run_key(RUN))).received == 1


def test_spans_of_another_run_on_the_same_server_are_left_for_it() -> None:
    store = _store_with(completion_id(RUN, 0), completion_id(OTHER_RUN, 0), completion_id(OTHER_RUN, 1))
    records = [record(0), record(1)]
    join = join_spans(records, store.take(server_run_key(RUN)))
    assert (join.received, join.joined) == (1, 1) and records[1].server_queue_ns is None
    assert store.count(server_run_key(OTHER_RUN)) == 2


def test_no_answered_request_and_tracing_off_are_never_used() -> None:
    nothing = spans_summary(join_spans([record(0, ok=False)], {}))
    assert nothing["used"] is False and nothing["share"] is None and "nothing to join" in nothing["reason"]
    silent = spans_summary(join_spans([record(0)], {}))
    assert silent["used"] is False and "no span of this run arrived" in silent["reason"]
    off = spans_summary(None, off_reason="the host's operator turned server spans off")
    assert off["source"] == "none" and off["used"] is False and off["received"] == 0
    assert off["reason"].startswith("the host's operator turned server spans off: ")


# --- waiting for a run's spans --------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_it_waits_for_the_answered_requests_spans_and_no_longer() -> None:
    store, clock = SpanStore(), FakeClock()
    records = [record(0), record(1)]
    store.add([ServerSpan(request_id=completion_id(RUN, 0))])

    def sleep(s: float) -> None:
        clock.sleep(s)
        if clock.now >= 0.3 and store.count(server_run_key(RUN)) < 2:
            store.add([ServerSpan(request_id=completion_id(RUN, 1))])  # the last export arrives

    got = collect_run_spans(store, RUN, records, clock=clock, sleep=sleep)
    assert sorted(got) == [0, 1] and 0.3 <= clock.now < 0.4


def test_it_waits_for_the_answered_requests_own_spans_not_for_a_count() -> None:
    store, clock = SpanStore(), FakeClock()
    records = [record(0), record(1), record(2, ok=False)]
    # Two spans, one of them of the request that failed: request 1's is still to come.
    store.add([ServerSpan(request_id=completion_id(RUN, 0)), ServerSpan(request_id=completion_id(RUN, 2))])
    got = collect_run_spans(store, RUN, records, clock=clock, sleep=clock.sleep)
    assert sorted(got) == [0, 2] and clock.now >= sp.SPAN_WAIT_S  # it waited its bound for 1


def test_it_gives_up_at_its_bound_and_sooner_for_a_server_that_never_exported() -> None:
    records = [record(0), record(1)]
    exporting, clock = SpanStore(), FakeClock()
    exporting.add([ServerSpan(request_id=completion_id(RUN, 0))])
    assert sorted(collect_run_spans(exporting, RUN, records, clock=clock, sleep=clock.sleep)) == [0]
    assert sp.SPAN_WAIT_S <= clock.now < sp.SPAN_WAIT_S + 0.1
    silent, clock = SpanStore(), FakeClock()
    assert collect_run_spans(silent, RUN, records, clock=clock, sleep=clock.sleep) == {}
    assert sp.SPAN_GRACE_S <= clock.now < sp.SPAN_GRACE_S + 0.1
