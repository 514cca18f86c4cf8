"""Execute one rollback rehearsal on this host: the candidate and B0 side by side.

Steps of :func:`rehearsal_execute` (called by the run pipeline for a run whose
``scenario`` is "rehearsal"; the claim, lease and finish are the pipeline's):

1. Split the host between two servers (:func:`split_host`): on the CPU engine
   each gets its own cores (``VLLM_CPU_OMP_THREADS_BIND``); on a GPU host with
   two or more devices each gets half of ``TAILTUNE_DEVICES``; with one device
   each gets half of the frozen ``gpu_memory_utilization``. The split is
   recorded in the run's summary.
2. Start the candidate (confirm its args, warm it up). Warm standby: start,
   confirm and warm B0 too, before the replay. Cold standby: B0 is started
   only at the switch, by a timer on the shared monotonic clock.
3. Replay the frozen trace (workers/replay/rehearsal.py) with a fixed origin:
   at ``switch_at_s`` new requests go to B0 (or, with a router, the switch
   command runs and every request goes to the router); streams still open
   on the candidate at the drain deadline after the switch are cut.
4. Scrape both servers' /metrics every second (B0's samples are stored with
   ``server = "b0"``, times from the replay's origin, as the records' are).
5. Both servers are stopped whatever happens. A switch command that exits
   non-zero (or times out) stops the replay and fails the run with its stderr's tail.

The spec's ``recovery.switch`` and ``recovery.router`` are names; this worker resolves them in
its own environment (``TAILTUNE_SWITCH_COMMANDS``, ``TAILTUNE_ROUTERS``: :func:`route_resolve`),
never from the spec or a database row, and fails the run before starting anything when its host
does not offer them. The switch command runs without a shell, with a minimal environment (none
of the worker's secrets), the two servers' URLs as whole-argument placeholders and environment
variables, and a time limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

from django.db import close_old_connections

from apps.experiments.generation import request_sampling
from apps.experiments.models import ServerConfig
from apps.experiments.recovery import recovery_options
from apps.experiments.spec_types import RecoverySpec
from apps.runs.hosts import local_routers, local_switch_commands
from apps.runs.ingest import metric_samples_ingest, records_writer
from apps.runs.models import Host, Run
from apps.workloads.services import trace_load
from workers.engine.launcher import HostConfig
from workers.engine.scrape import Scraper
from workers.engine.server import EngineError, EngineFailed, EngineServer, read_tail
from workers.replay.config import ReplayConfig
from workers.replay.run import run_replay

log = logging.getLogger(__name__)

# Time between fixing the replay's origin and the origin itself: the replay's own process
# must be up and its plan built before the first planned send.
ORIGIN_LEAD_S = 3.0
SWITCH_COMMAND_TIMEOUT_S = 60.0
# What the switch command inherits from the worker's environment: only these (the worker's own
# holds DATABASE_URL and SECRET_KEY); the servers' URLs are added as TAILTUNE_CANDIDATE_URL
# and TAILTUNE_B0_URL.
SWITCH_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
# How much of a failed switch command's stderr the run's reason keeps (its end).
SWITCH_STDERR_CHARS = 500
SCRAPE_INTERVAL_S = 1.0


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


def split_host(
    host: HostConfig, controls: dict[str, Any], *, cpus: list[int] | None = None
) -> tuple[tuple[HostConfig, dict[str, Any]], tuple[HostConfig, dict[str, Any]], str]:
    """((candidate host, controls), (B0 host, controls), how the host was split)."""
    devices = [d for d in host.devices.split(",") if d]
    if len(devices) >= 2:
        half = len(devices) // 2
        a, b = ",".join(devices[:half]), ",".join(devices[half:])
        return (
            (dataclasses.replace(host, devices=a), dict(controls)),
            (dataclasses.replace(host, devices=b), dict(controls)),
            f"devices {a} for the candidate, {b} for B0",
        )
    if len(devices) == 1:
        share = dict(controls)
        note = f"device {devices[0]} shared"
        if share.get("gpu_memory_utilization"):
            share["gpu_memory_utilization"] = round(float(share["gpu_memory_utilization"]) / 2, 4)
            note += f": each server gets gpu_memory_utilization {share['gpu_memory_utilization']}"
        return (host, share), (host, dict(share)), note
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))

    def bound(cores: str) -> tuple[HostConfig, dict[str, Any]]:
        env = {**host.extra_env, "VLLM_CPU_OMP_THREADS_BIND": cores}
        return dataclasses.replace(host, extra_env=env), dict(controls)

    if len(cpus) < 2:
        both = ",".join(map(str, cpus))
        return bound(both), bound(both), f"one core ({both}) shared by both servers"
    half = len(cpus) // 2
    a, b = ",".join(map(str, cpus[:half])), ",".join(map(str, cpus[half:]))
    return bound(a), bound(b), f"cores {a} for the candidate, {b} for B0"


class _Both:
    """What the run's cancel watcher stops: both servers (each stop() is idempotent)."""

    def __init__(self, *servers: EngineServer) -> None:
        self.servers = servers

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _since(origin_ns: int) -> float:
    return round((time.perf_counter_ns() - origin_ns) / 1e9, 3)


def _sleep_until(target_ns: int, stop: threading.Event) -> bool:
    """Sleep until the monotonic time ``target_ns``; False if ``stop`` came first."""
    while (delay := (target_ns - time.perf_counter_ns()) / 1e9) > 0:
        if stop.wait(min(delay, 0.2)):
            return False
    return True


def rehearsal_execute(
    run: Run,
    host: Host,
    *,
    model: str,
    controls: dict[str, Any],
    host_config: HostConfig,
    log_dir: Path,
    stop: threading.Event,
    watcher: Any,
) -> tuple[str, str, dict[str, Any]]:
    """Steps 1-5 (see the module docstring); returns (status, reason, run fields)."""
    experiment = run.experiment
    options = recovery_options(experiment.spec or {})
    try:
        route = route_resolve(options, host.name)
    except SwitchFailed as exc:  # before any server starts
        return Run.Status.FAILED, str(exc), {}
    b0_cell = experiment.cells.get(role=ServerConfig.Role.BASELINE)
    (cand_host, cand_controls), (b0_host, b0_controls), split_note = split_host(host_config, controls)
    ports = options.get("ports") or {}
    candidate = EngineServer(
        model=model,
        cell_args=run.cell.args,
        controls=cand_controls,
        host=cand_host,
        log_path=log_dir / "server.log",
        port=ports.get("candidate"),
    )
    b0 = EngineServer(
        model=model,
        cell_args=b0_cell.args,
        controls=b0_controls,
        host=b0_host,
        log_path=log_dir / "b0.log",
        port=ports.get("b0"),
    )
    watcher.server = _Both(candidate, b0)  # a cancel while starting stops both
    cold = options["standby"] == "cold"
    facts: dict[str, Any] = {
        "standby": options["standby"],
        "split": split_note,
        "candidate_url": candidate.base_url,
        "b0_url": b0.base_url,
        "b0_cell": b0_cell.cell_id,
    }
    if route is not None:  # the operator's names, never the command or the address behind them
        facts.update(switch=route.switch, router=route.router)

    def track() -> None:
        Host.objects.filter(pk=host.pk).update(server_pids=candidate.tracked_pids() + b0.tracked_pids())

    with candidate, b0:
        warm_error: list[BaseException] = []

        def start_b0_warm() -> None:
            try:
                b0.start()
                b0.confirm()
                b0.warm_up(n=4)
            except EngineError as exc:  # re-raised in the worker's thread below
                warm_error.append(EngineFailed(f"B0 (warm standby): {exc.reason}", log_tail=exc.log_tail))
            except BaseException as exc:
                warm_error.append(exc)

        b0_thread = None
        if not cold:
            b0_thread = threading.Thread(target=start_b0_warm, name=f"run-{run.pk}-b0", daemon=True)
            b0_thread.start()
        try:
            candidate.start()
            track()
            Run.objects.filter(pk=run.pk).update(server_pid=candidate.pgid)
            run_facts = candidate.confirm()
            Run.objects.filter(pk=run.pk).update(**run_facts.run_fields())
            candidate.warm_up(n=4)
        except BaseException:
            if b0_thread is not None:  # B0 may still be starting: stop it, and wait for its thread
                b0.stop()
                b0_thread.join()
            raise
        if b0_thread is not None:
            b0_thread.join()
            track()
            if warm_error:
                raise warm_error[0]
        if watcher.cancelled:
            return Run.Status.CANCELLED, "cancelled before the replay started", {}
        Run.objects.filter(pk=run.pk, status__in=Run.ACTIVE).update(status=Run.Status.WARMING)
        return _replay(run, host, candidate, b0, options, route, facts, stop, watcher, cold=cold, track=track)


def _replay(
    run: Run,
    host: Host,
    candidate: EngineServer,
    b0: EngineServer,
    options: RecoverySpec,
    route: Route | None,
    facts: dict[str, Any],
    stop: threading.Event,
    watcher: Any,
    *,
    cold: bool,
    track: Any,
) -> tuple[str, str, dict[str, Any]]:
    trace = trace_load(sha256=run.trace_sha256)
    requests = [r.to_json() for r in trace.requests]
    switch_s = float(cast(float, options["switch_at_s"]))  # recovery_options fills it from the windows
    router = route.url if route is not None else None
    timing = {"origin_ns": 0}  # fixed just before the replay starts, after the "before" scrapes
    clock = lambda: time.perf_counter_ns() - timing["origin_ns"]  # noqa: E731 - times from the replay's origin
    cand_scraper = Scraper(candidate.base_url, interval_s=SCRAPE_INTERVAL_S, clock=clock)
    b0_scraper = Scraper(b0.base_url, interval_s=SCRAPE_INTERVAL_S, clock=clock)
    side_errors: list[str] = []
    done = threading.Event()
    b0_up = threading.Event()  # a cold B0 answered its health check

    def switch_command() -> None:
        try:
            assert route is not None  # only with a router
            _run_switch_command(route.argv, candidate, b0, facts, timing["origin_ns"])
        except SwitchFailed as exc:
            side_errors.append(str(exc))
            stop.set()

    def at_switch() -> None:
        origin_ns = timing["origin_ns"]
        command = None
        try:
            if not _sleep_until(origin_ns + round(switch_s * 1e9), done):
                return
            if router:  # runs while a cold B0 starts, as both would in an incident
                command = threading.Thread(
                    target=switch_command, name=f"run-{run.pk}-switch-command", daemon=True
                )
                command.start()
            if cold:
                facts["b0_started_at_s"] = _since(origin_ns)
                b0.start()
                b0_up.set()
                facts["b0_healthy_at_s"] = _since(origin_ns)
                track()
                if not done.is_set():
                    b0_scraper.start_during()
                b0.confirm()
        except EngineError as exc:
            side_errors.append(f"B0 did not start at the switch: {exc.reason}")
            facts["b0_log_tail"] = exc.log_tail
        except Exception as exc:
            side_errors.append(f"at the switch: {type(exc).__name__}: {exc}")
        finally:
            if command is not None:
                command.join()
            close_old_connections()

    switcher = threading.Thread(target=at_switch, name=f"run-{run.pk}-switch", daemon=True)
    on_batch = records_writer(run_pk=run.pk)
    for scraper in (cand_scraper, b0_scraper):
        if scraper is b0_scraper and cold:
            continue
        with contextlib.suppress(Exception):
            scraper.scrape("before")  # on the monotonic clock: moved onto the replay's below
    origin_ns = time.perf_counter_ns() + round(ORIGIN_LEAD_S * 1e9)
    timing["origin_ns"] = origin_ns
    for scraper in (cand_scraper, b0_scraper):
        for sample in scraper.samples:
            sample["t_ns"] -= origin_ns
        if not (scraper is b0_scraper and cold):
            scraper.start_during()
    switcher.start()
    watcher.origin = time.monotonic() + ORIGIN_LEAD_S
    try:
        config = ReplayConfig(
            base_url=router or candidate.base_url,
            model=candidate.served_model_name,
            run_id=str(run.run_id),
            warmup_s=run.warmup_seconds,
            observation_s=run.observation_seconds,
            drain_deadline_s=run.drain_deadline_seconds,
            max_dispatch_lag_ms=run.experiment.workload.max_dispatch_lag_ms,
            extra_body=request_sampling(run.experiment.generation),
            output_mode=run.experiment.workload.output_mode,
            isolated=True,
            rehearsal={
                "switch_at_s": switch_s,
                "cut_after_s": run.drain_deadline_seconds,
                "b0_url": None if router else b0.base_url,
                "wait_for_b0": cold,
                "backend_header": route.backend_header if route is not None else None,
            },
        )
        result = run_replay(requests, config, on_batch=on_batch, stop=stop, origin_ns=origin_ns)
    finally:
        done.set()
        if switcher.is_alive() and cold and not b0_up.is_set():
            b0.stop()  # still starting when the replay ended: its start() fails and says so
        # A B0 that is up is never stopped here: the switch thread may still be confirming its
        # args (slow on a loaded host), and stopping it then read as "B0 exited during the run".
        switcher.join()  # bounded: a switch command times out, a stopped B0 ends start()
        for who, scraper in (("", cand_scraper), ("b0", b0_scraper)):
            scraper.stop_during()
            with contextlib.suppress(Exception):
                scraper.scrape("after")
            scraper.close()
            metric_samples_ingest(run_pk=run.pk, samples=scraper.samples, server=who)

    summary = result.summary()
    summary["rehearsal"] = {**facts, **(result.rehearsal or {})}
    summary["scrape_errors"] = (cand_scraper.errors + b0_scraper.errors)[:20]
    summary["servers"] = {"candidate": candidate.tracked_pids(), "b0": b0.tracked_pids()}
    fields = {
        **result.run_fields(),
        "generation": result.extra_body,
        "summary": summary,
        "log_tail": read_tail(candidate.log_path) + "\n--- B0 ---\n" + read_tail(b0.log_path),
    }
    if side_errors and any("switch command" in e for e in side_errors):
        return Run.Status.FAILED, "; ".join(side_errors), fields
    if watcher.cancelled or result.stopped:
        return Run.Status.CANCELLED, "cancelled mid-run; partial records kept", fields
    for who, server in (("candidate", candidate), ("B0", b0)):
        death = server.failure() if server.proc is not None else None
        if death is not None:
            return Run.Status.FAILED, f"{who}: {death}", fields
    if side_errors:
        return Run.Status.FAILED, "; ".join(side_errors), fields
    if not result.valid:
        return Run.Status.INVALID, result.invalid_reason, fields
    return Run.Status.DONE, "", fields


def _run_switch_command(
    argv: tuple[str, ...] | list[str],
    candidate: EngineServer,
    b0: EngineServer,
    facts: dict[str, Any],
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
