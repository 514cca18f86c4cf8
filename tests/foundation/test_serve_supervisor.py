"""`manage.py serve` keeps the web up and restarts a worker that dies, with a growing delay."""

from __future__ import annotations

from apps.runs.management.commands.serve import Supervisor


class FakeProc:
    pids = iter(range(100, 200))

    def __init__(self, argv: list[str], **_: object) -> None:
        self.argv, self.pid, self.returncode = argv, next(self.pids), None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = -sig

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9


def test_a_dead_worker_is_restarted_with_backoff_and_the_web_stays_up() -> None:
    now = [0.0]
    said: list[str] = []
    sup = Supervisor(web=["web"], worker=["worker"], say=said.append, popen=FakeProc, clock=lambda: now[0])
    sup.start()
    web, first = sup.web, sup.worker
    first.returncode = -9  # SIGKILLed
    assert sup.step() and sup.worker is first  # seen, restart scheduled in 1 s
    assert said[-1] == f"the worker (pid {first.pid}) exited with code -9; restarting it in 1 s"
    now[0] = 1.0
    assert sup.step() and sup.worker is not first and sup.restarts == 1
    second = sup.worker
    second.returncode = 1  # dies again at once: the delay doubles
    now[0] = 1.5
    sup.step()
    assert said[-1].endswith("restarting it in 2 s")
    now[0] = 3.0
    assert sup.step() and sup.worker is second  # not yet
    now[0] = 3.6
    sup.step()
    assert sup.worker is not second and sup.restarts == 2 and web.poll() is None
    # Ten minutes up resets the delay.
    third = sup.worker
    now[0] = 3.6 + Supervisor.STEADY_S
    third.returncode = 1
    sup.step()
    assert said[-1].endswith("restarting it in 1 s")
    # The web exiting ends the service; stopping signals whatever still runs.
    web.returncode = 3
    assert not sup.step() and sup.web_failed == (web.pid, 3)
    sup.stop_all()
