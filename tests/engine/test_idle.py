"""The idle check between two traces on one server (workers/engine/idle.py), against a fake /metrics."""

from __future__ import annotations

from collections.abc import Iterator

import httpx

from workers.engine.idle import STEADY_S, idle_check, not_idle_reason


def metrics(running: int, waiting: int, kv: float) -> str:
    labels = '{engine="0",model_name="tiny"}'
    values = {"num_requests_running": running, "num_requests_waiting": waiting, "kv_cache_usage_perc": kv}
    return "".join(
        f"# TYPE vllm:{name} gauge\nvllm:{name}{labels} {float(value)}\n" for name, value in values.items()
    )


def client(answers: Iterator[str | None]) -> httpx.Client:
    """Each /metrics read takes the next answer; None is a server that does not answer."""
    last: list[str | None] = [None]

    def handler(request: httpx.Request) -> httpx.Response:
        last[0] = next(answers, last[0])
        if last[0] is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text=last[0])

    return httpx.Client(transport=httpx.MockTransport(handler))


def run(answers: list[str | None], timeout_s: float = 1.0) -> dict:
    with client(iter(answers)) as http:
        return idle_check("http://engine", kv_idle=0.01, reset_prefix_cache=False, timeout_s=timeout_s,
                          poll_s=0.05, client=http)  # fmt: skip


def test_a_server_that_drains_is_idle_once_two_reads_agree_and_says_how_it_went() -> None:
    check = run([metrics(1, 2, 0.5), metrics(1, 0, 0.3), metrics(0, 0, 0.01)], timeout_s=5.0)
    assert check["idle"] is True and check["running"] == 0 and check["waiting"] == 0
    assert check["busy_reads"] == 2 and check["failed_reads"] == 0
    assert check["reads"] >= 3 + STEADY_S / 0.05 - 1
    assert check["idle_for_s"] >= STEADY_S


def test_a_busy_server_is_not_idle_and_the_reason_counts_the_busy_reads() -> None:
    check = run([metrics(1, 3, 0.6)])
    assert check["idle"] is False and check["idle_for_s"] is None
    assert check["busy_reads"] == check["reads"] >= 2
    reason = not_idle_reason(check)
    assert reason.startswith("server not idle at the run's start after ")
    assert (
        f"1.0 running, 3.0 waiting, KV 60.0% (idle 1.0%); busy on {check['reads']} of {check['reads']} reads"
        in reason
    )


def test_failed_reads_are_counted_even_when_a_later_read_answers() -> None:
    check = run([None, None, None, metrics(2, 0, 0.4)], timeout_s=0.5)
    assert check["idle"] is False and "error" not in check
    assert check["failed_reads"] == 3 and check["busy_reads"] == check["reads"] - 3 >= 1
    reason = not_idle_reason(check)
    assert f"; 3 of {check['reads']} reads failed (last: /metrics: refused)" in reason


def test_an_idle_read_the_time_runs_out_on_is_not_enough_and_the_reason_says_so() -> None:
    # No time left after the first read: idle was seen once and could not be confirmed.
    check = run([metrics(0, 0, 0.0)], timeout_s=0.0)
    assert check["idle"] is False and check["reads"] == 1 and check["busy_reads"] == 0
    assert check["idle_for_s"] is not None and check["idle_for_s"] < STEADY_S
    reason = not_idle_reason(check)
    assert reason.endswith(
        f"; idle for only {check['idle_for_s']:g} s when the time ran out ({STEADY_S:g} s needed)"
    )


def test_a_server_that_never_answers_says_so() -> None:
    check = run([None])
    assert check["idle"] is False and check["failed_reads"] == check["reads"]
    assert check["error"] == "/metrics: refused"
    assert not_idle_reason(check).endswith("; /metrics: refused")
