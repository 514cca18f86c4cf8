"""The cold-standby switch's end (workers/switch.py Switchover.finish): a B0 that came up is
never stopped under the switch thread, and one stopped while starting is not read as a death.

The servers are fakes: what is checked is which server finish() stops, not vLLM."""

from __future__ import annotations

import threading

from workers.switch import Switchover


class FakeB0:
    """A cold B0 whose start() polls health until it answers or it is stopped."""

    def __init__(self, *, healthy: bool) -> None:
        self.base_url = "http://127.0.0.1:1"
        self.healthy = healthy
        self.started = threading.Event()
        self.release = threading.Event()  # start()'s own poll has not seen health yet
        self.stopped = False

    def start(self) -> None:
        self.started.set()
        self.release.wait(10)
        if self.stopped:
            raise RuntimeError("stopped while starting")

    def confirm(self) -> None:
        pass

    def answers_health(self) -> bool:
        if self.healthy:
            self.release.set()  # start()'s next poll would see it too
        return self.healthy

    def stop(self) -> None:
        self.stopped = True
        self.release.set()


class FakeScraper:
    def start_during(self) -> None:
        pass


def _switch(b0: FakeB0) -> Switchover:
    switch = Switchover(
        1,
        candidate=object(),  # type: ignore[arg-type]
        b0=b0,  # type: ignore[arg-type]
        route=None,
        facts={},  # type: ignore[arg-type]
        stop=threading.Event(),
        switch_s=0.0,
        cold=True,
        track=lambda: None,
        b0_scraper=FakeScraper(),  # type: ignore[arg-type]
    )
    switch.start(0)
    assert b0.started.wait(5)
    return switch


def test_a_b0_the_replay_saw_ready_is_not_stopped_while_start_still_polls(monkeypatch):
    monkeypatch.setattr("workers.switch.close_old_connections", lambda: None)
    b0 = FakeB0(healthy=False)  # health now fails (a stalled host), but the replay saw it up
    switch = _switch(b0)
    threading.Timer(0.2, b0.release.set).start()
    switch.finish(b0_seen_ready=True)
    assert not b0.stopped and not switch.stopped_b0
    assert switch.b0_up.is_set() and switch.errors == []


def test_a_b0_that_answers_health_at_the_end_is_not_stopped(monkeypatch):
    monkeypatch.setattr("workers.switch.close_old_connections", lambda: None)
    b0 = FakeB0(healthy=True)
    switch = _switch(b0)
    switch.finish()
    assert not b0.stopped and not switch.stopped_b0 and switch.b0_up.is_set()


def test_a_b0_still_starting_is_stopped_and_says_so(monkeypatch):
    monkeypatch.setattr("workers.switch.close_old_connections", lambda: None)
    b0 = FakeB0(healthy=False)
    switch = _switch(b0)
    switch.finish()
    assert b0.stopped and switch.stopped_b0 and not switch.b0_up.is_set()
    assert switch.errors and "at the switch" in switch.errors[0]
