"""A rehearsal's switch: the operator's names resolved on this host, and the switch itself.

The spec's ``recovery.switch`` and ``recovery.router`` are names; :func:`route_resolve` resolves
them in this worker's own environment (``TAILTUNE_SWITCH_COMMANDS``, ``TAILTUNE_ROUTERS``), never
from the spec or a database row, and refuses (:class:`SwitchFailed`, naming the setting) names
its host does not offer. At ``switch_at_s`` after the replay's origin, :class:`Switchover` (a
thread beside the replay, workers/rehearsal_run.py) runs the switch command and starts a cold B0.
The switch command runs without a shell, with a minimal environment (none of the worker's
secrets), the two servers' URLs as whole-argument placeholders and environment variables, and a
time limit; one that exits non-zero (or times out) stops the replay and fails the run with its
stderr's tail.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from django.db import close_old_connections

from apps.experiments.spec_types import RecoverySpec
from apps.runs.hosts import local_routers, local_switch_commands
from apps.runs.summary_types import RehearsalWorkerFacts
from workers.engine.scrape import Scraper
from workers.engine.server import EngineError, EngineServer

SWITCH_COMMAND_TIMEOUT_S = 60.0
# What the switch command inherits from the worker's environment: only these (the worker's own
# holds DATABASE_URL and SECRET_KEY); the servers' URLs are added as TAILTUNE_CANDIDATE_URL
# and TAILTUNE_B0_URL.
SWITCH_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
# How much of a failed switch command's stderr the run's reason keeps (its end).
SWITCH_STDERR_CHARS = 500


class SwitchFailed(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Route:
    """The operator's router and switch command a rehearsal uses (resolved on this host)."""

    switch: str
    argv: tuple[str, ...]
    router: str
    url: str
    backend_header: str


def route_resolve(options: RecoverySpec, host_name: str) -> Route | None:
    """The spec's ``recovery.switch`` / ``recovery.router`` names resolved in this worker's own
    environment; None for tailtune's own switch. SwitchFailed, naming the setting, when this
    host does not offer them or the stored spec still carries a program or an address."""
    stored = cast(dict[str, Any], options)
    old = [key for key in ("switch_command", "route_url", "backend_header") if stored.get(key) is not None]
    if old:
        raise SwitchFailed(
            f"the spec gives recovery.{old[0]}, which no longer runs: name a switch from the host's "
            "TAILTUNE_SWITCH_COMMANDS and a router from its TAILTUNE_ROUTERS (recovery.switch, recovery.router)"
        )
    switch, router = options.get("switch"), options.get("router")
    if switch is None and router is None:
        return None
    commands, routers = local_switch_commands(), local_routers()
    for key, name, offered, setting in (
        ("switch", switch, commands, "TAILTUNE_SWITCH_COMMANDS"),
        ("router", router, routers, "TAILTUNE_ROUTERS"),
    ):
        if name is None or name not in offered:
            raise SwitchFailed(
                f"host {host_name} offers no {key} {name!r} (its {setting} lists: "
                f"{', '.join(sorted(offered)) or 'none'})"
            )
    assert switch is not None and router is not None  # checked just above
    return Route(
        switch=switch,
        argv=tuple(commands[switch]),
        router=router,
        url=routers[router]["url"],
        backend_header=routers[router]["backend_header"],
    )


def switch_argv(argv: tuple[str, ...] | list[str], *, candidate_url: str, b0_url: str) -> list[str]:
    """The command with each item that is exactly a placeholder replaced by its URL; nothing is
    spliced into a longer item (apps/runs/hosts.switch_commands refuses such items)."""
    urls = {"{candidate_url}": candidate_url, "{b0_url}": b0_url}
    return [urls.get(item, item) for item in argv]


def _since(origin_ns: int) -> float:
    return round((time.perf_counter_ns() - origin_ns) / 1e9, 3)


def _sleep_until(target_ns: int, stop: threading.Event) -> bool:
    """Sleep until the monotonic time ``target_ns``; False if ``stop`` came first."""
    while (delay := (target_ns - time.perf_counter_ns()) / 1e9) > 0:
        if stop.wait(min(delay, 0.2)):
            return False
    return True


class Switchover:
    """Step 3's switch, on a thread of its own: at ``switch_at_s`` after the origin it runs the
    operator's switch command (with a router) and starts a cold B0; what goes wrong is kept in
    ``errors`` (a failed switch command also stops the replay)."""

    def __init__(
        self,
        run_pk: int,
        candidate: EngineServer,
        b0: EngineServer,
        route: Route | None,
        facts: RehearsalWorkerFacts,
        stop: threading.Event,
        *,
        switch_s: float,
        cold: bool,
        track: Callable[[], None],
        b0_scraper: Scraper,
    ) -> None:
        self.candidate, self.b0, self.route, self.facts, self.stop = candidate, b0, route, facts, stop
        self.switch_s, self.cold, self.track, self.b0_scraper = switch_s, cold, track, b0_scraper
        self.origin_ns = 0  # fixed by start()
        self.errors: list[str] = []
        self.done = threading.Event()  # the replay ended
        self.b0_up = threading.Event()  # a cold B0 answered its health check
        self.stopped_b0 = False  # finish() stopped a cold B0 that had not come up
        self._thread = threading.Thread(target=self._at_switch, name=f"run-{run_pk}-switch", daemon=True)
        self._run_pk = run_pk

    def start(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self._thread.start()

    def finish(self, *, b0_seen_ready: bool = False) -> None:
        """After the replay: a cold B0 still starting is stopped (its start() fails and says so,
        and ``stopped_b0`` keeps its exit from reading as a death during the run).

        A B0 that is up is never stopped here, as the switch thread may still be confirming its
        args (slow on a loaded host). "Up" is what the replay's own client saw
        (``b0_seen_ready``) or a health check now: the client's poll can see B0 healthy before
        start()'s own, and a busy host can keep start() in its sleep while the replay ends."""
        self.done.set()
        if self._thread.is_alive() and self.cold and not self.b0_up.is_set():
            if not (b0_seen_ready or self.b0.answers_health()):
                self.stopped_b0 = True
                self.b0.stop()
        self._thread.join()  # bounded: a switch command times out, a healthy B0 ends start() at
        # its next poll, a stopped B0 ends it at once

    def _switch_command(self) -> None:
        try:
            assert self.route is not None  # only with a router
            _run_switch_command(self.route.argv, self.candidate, self.b0, self.facts, self.origin_ns)
        except SwitchFailed as exc:
            self.errors.append(str(exc))
            self.stop.set()

    def _at_switch(self) -> None:
        origin_ns = self.origin_ns
        command = None
        try:
            if not _sleep_until(origin_ns + round(self.switch_s * 1e9), self.done):
                return
            if self.route is not None:  # runs while a cold B0 starts, as both would in an incident
                command = threading.Thread(
                    target=self._switch_command, name=f"run-{self._run_pk}-switch-command", daemon=True
                )
                command.start()
            if self.cold:
                self.facts["b0_started_at_s"] = _since(origin_ns)
                self.b0.start()
                self.b0_up.set()
                self.facts["b0_healthy_at_s"] = _since(origin_ns)
                self.track()
                if not self.done.is_set():
                    self.b0_scraper.start_during()
                self.b0.confirm()
        except EngineError as exc:
            self.errors.append(f"B0 did not start at the switch: {exc.reason}")
            self.facts["b0_log_tail"] = exc.log_tail
        except Exception as exc:
            self.errors.append(f"at the switch: {type(exc).__name__}: {exc}")
        finally:
            if command is not None:
                command.join()
            close_old_connections()


def _run_switch_command(
    argv: tuple[str, ...] | list[str],
    candidate: EngineServer,
    b0: EngineServer,
    facts: RehearsalWorkerFacts,
    origin_ns: int,
) -> None:
    """Run the operator's switch command (no shell, a minimal environment, a time limit);
    SwitchFailed with the end of its stderr unless it exits 0."""
    env = {k: v for k, v in os.environ.items() if k in SWITCH_ENV_KEEP}
    env.update({"TAILTUNE_CANDIDATE_URL": candidate.base_url, "TAILTUNE_B0_URL": b0.base_url})
    command = switch_argv(argv, candidate_url=candidate.base_url, b0_url=b0.base_url)
    facts["switch_command_started_at_s"] = _since(origin_ns)
    with tempfile.TemporaryFile() as stderr:
        try:
            done = subprocess.run(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                timeout=SWITCH_COMMAND_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SwitchFailed(
                f"the switch command did not finish in {SWITCH_COMMAND_TIMEOUT_S:g} s: {_tail(stderr)}"
            ) from None
        except OSError as exc:
            raise SwitchFailed(
                f"the switch command {argv[0]!r} could not start: {exc.strerror or exc}"
            ) from None
        facts["switch_command_exit"] = done.returncode
        facts["switch_command_ended_at_s"] = _since(origin_ns)
        if done.returncode != 0:
            raise SwitchFailed(f"the switch command exited with status {done.returncode}: {_tail(stderr)}")


def _tail(file: Any) -> str:
    """The last SWITCH_STDERR_CHARS characters of a command's stderr, printable only."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - 4 * SWITCH_STDERR_CHARS))
    text = file.read().decode("utf-8", errors="replace").strip()
    text = "".join(ch if ch.isprintable() or ch == "\n" else "?" for ch in text)
    return text[-SWITCH_STDERR_CHARS:]
