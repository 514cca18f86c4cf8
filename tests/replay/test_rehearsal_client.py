"""The rehearsal client against mock servers: the switch, the cold hold, the cut, the router."""

from __future__ import annotations

import threading
import urllib.request

from tests.replay.helpers import make_requests
from tests.replay.mockserver import Behaviour, MockConfig, MockServer
from tests.support_router import running_router
from workers.engine.launcher import free_port
from workers.replay.config import ReplayConfig
from workers.replay.rehearsal_client import CUT_ERROR
from workers.replay.run import run_replay


def _replay(requests, base_url, rehearsal, origin_ns=None, **kw):
    config = ReplayConfig(
        base_url=base_url,
        model="mock",
        run_id="rh",
        warmup_s=0.0,
        observation_s=kw.pop("observation_s", 1.0),
        drain_deadline_s=kw.pop("drain_deadline_s", 2.0),
        max_dispatch_lag_ms=1000.0,
        rehearsal=rehearsal,
        **kw,
    )
    return run_replay(requests, config, origin_ns=origin_ns)


def test_switch_routes_new_requests_to_b0_and_cuts_open_streams_at_the_deadline():
    # 20 requests over 1 s, switch at 0.5 s. The candidate streams slowly (5 s per request),
    # so every request it took is still open at the cut (switch + 0.3 s).
    requests = make_requests(20, spacing_s=0.05, output_tokens=50)
    slow = MockConfig(default=Behaviour(ttft_s=0.01, itl_s=0.1))
    fast = MockConfig(default=Behaviour(ttft_s=0.01, itl_s=0.001))
    with MockServer(slow) as candidate, MockServer(fast) as b0:
        result = _replay(
            requests,
            candidate.base_url,
            {"switch_at_s": 0.5, "cut_after_s": 0.3, "b0_url": b0.base_url, "wait_for_b0": False},
        )
        by_index = {r.index: r for r in result.records}
        before = [i for i in by_index if by_index[i].planned_ns < 500_000_000]
        after = [i for i in by_index if i not in before]
        assert len(before) == 10 and len(after) == 10
        # The servers' own logs say who got what.
        assert {int(e.tag.rpartition(":")[2]) for e in candidate.log} == set(before)
        assert {int(e.tag.rpartition(":")[2]) for e in b0.log} == set(after)
    for i in before:
        r = by_index[i]
        assert r.backend == "candidate"
        assert r.cut and r.unfinished and not r.ok and r.error == CUT_ERROR
        assert 0.8e9 <= r.end_ns < 1.2e9  # cut at switch + drain deadline, not before
    for i in after:
        assert by_index[i].backend == "b0" and by_index[i].ok and not by_index[i].cut
    assert result.rehearsal == {
        "switch_at_s": 0.5,
        "cut_at_s": 0.8,
        "mode": "own client",
        "cold_wait": False,
        "b0_ready_at_s": None,
        "cut": 10,
    }


def test_cold_standby_holds_new_requests_until_b0_answers_health():
    port = free_port()
    b0 = MockServer(MockConfig(default=Behaviour(ttft_s=0.01, itl_s=0.001)), port=port)
    starter = threading.Timer(0.9, b0.start)  # B0 comes up 0.6 s after the switch
    requests = make_requests(10, spacing_s=0.1, output_tokens=4)
    try:
        with MockServer() as candidate:
            starter.start()
            result = _replay(
                requests,
                candidate.base_url,
                {
                    "switch_at_s": 0.3,
                    "cut_after_s": 2.0,
                    "b0_url": f"http://127.0.0.1:{port}",
                    "wait_for_b0": True,
                },
            )
    finally:
        starter.join()
        b0.stop()
    ready = result.rehearsal["b0_ready_at_s"]
    assert 0.85 <= ready <= 1.5
    after = [r for r in result.records if r.planned_ns >= 300_000_000]
    assert after and all(r.ok and r.backend == "b0" for r in after)
    # Every request that arrived while B0 was starting waited for it, and the wait is part of
    # its latency from arrival; none was sent before B0 was healthy.
    held = [r for r in after if r.planned_ns < ready * 1e9 - 50_000_000]
    assert held
    for r in held:
        assert r.sent_ns >= ready * 1e9 - 1e6
        assert r.admission_delay_ns > 0
        assert r.first_token_ns - r.planned_ns >= ready * 1e9 - r.planned_ns - 1e6


def test_router_mode_records_the_backend_header():
    fast = MockConfig(default=Behaviour(ttft_s=0.01, itl_s=0.001))
    with (
        MockServer(fast) as candidate,
        MockServer(fast) as b0,
        running_router({"candidate": candidate.base_url, "b0": b0.base_url}) as url,
    ):
        # The worker runs the switch command; here the test flips the router at 0.5 s itself.
        flip = threading.Timer(
            0.5,
            lambda: urllib.request.urlopen(urllib.request.Request(url + "/switch?to=b0", method="POST")),
        )
        flip.start()
        result = _replay(
            make_requests(20, spacing_s=0.05, output_tokens=4),
            url,
            {"switch_at_s": 0.5, "cut_after_s": 1.0, "b0_url": None, "backend_header": "X-Served-By"},
        )
        flip.join()
    backends = [r.backend for r in sorted(result.records, key=lambda r: r.index)]
    assert set(backends) == {"candidate", "b0"}
    # Once the router switched, it stays switched.
    first_b0 = backends.index("b0")
    assert backends[first_b0:] == ["b0"] * (len(backends) - first_b0)
    assert result.rehearsal["mode"] == "router"
    assert all(r.ok for r in result.records)


def test_a_request_planned_before_the_switch_but_dispatched_after_its_deadline_is_never_served():
    # Two requests before the switch; the client is made late (origin in the past) so that the
    # second one is dispatched after switch + deadline: it is cut (or unsent), never ok.
    import time

    requests = make_requests(2, spacing_s=0.5, output_tokens=4)
    with MockServer() as candidate, MockServer() as b0:
        result = _replay(
            requests,
            candidate.base_url,
            {"switch_at_s": 0.6, "cut_after_s": 0.1, "b0_url": b0.base_url, "wait_for_b0": False},
            origin_ns=time.perf_counter_ns() - 1_000_000_000,  # already 1 s late
        )
    late = {r.index: r for r in result.records}[1]
    assert not late.ok and (late.cut or not late.sent), late


def test_a_stream_whose_end_a_stalled_client_saw_only_after_the_deadline_is_cut(monkeypatch):
    # The candidate's stream (0.5 s) is open at the deadline (switch 0.1 s + 0.3 s). The client's
    # loop is then blocked from 0.36 s to ~0.8 s (as a starved load generator is: a core-less
    # client on a host running two servers), so the stream's last frames and the deadline's timer
    # are handled in one pass. The stream was open at the deadline: it is cut, never "ok".
    import time

    from workers.replay.rehearsal_client import RehearsalReplay

    requests = make_requests(1, output_tokens=50) + make_requests(1, output_tokens=2, start_s=0.35)
    requests[1]["index"] = 1
    stream = MockConfig(default=Behaviour(ttft_s=0.01, itl_s=0.01))

    def stall(self, record, response):
        if record.index == 1:
            time.sleep(0.45)

    monkeypatch.setattr(RehearsalReplay, "_on_response", stall)
    with MockServer(stream) as candidate, MockServer(stream) as b0:
        result = _replay(
            requests,
            candidate.base_url,
            {"switch_at_s": 0.1, "cut_after_s": 0.3, "b0_url": b0.base_url, "wait_for_b0": False},
            observation_s=0.5,
        )
    first = next(r for r in result.records if r.index == 0)
    assert result.loop_stall_max_ms >= 300  # the stall happened, measured by the client itself
    assert first.backend == "candidate" and first.cut and first.unfinished and first.error == CUT_ERROR
    assert first.end_ns >= 0.4e9
    assert result.rehearsal["cut"] == 1
