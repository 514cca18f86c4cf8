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
3. Replay the frozen trace (workers/replay/rehearsal_client.py) with a fixed origin:
   at ``switch_at_s`` new requests go to B0 (or, with a router, the switch
   command runs and every request goes to the router); streams still open
   on the candidate at the drain deadline after the switch are cut.
4. Scrape both servers' /metrics every second (B0's samples are stored with
   ``server = "b0"``, times from the replay's origin, as the records' are).
5. Both servers are stopped whatever happens. A switch command that exits
   non-zero (or times out) stops the replay and fails the run with its stderr's tail.

The spec's ``recovery.switch`` and ``recovery.router`` are names this worker resolves in its own
environment, failing the run before starting anything when its host does not offer them; the
switch command and the switch-time thread are :mod:`workers.switch`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from apps.experiments.generation import request_sampling
from apps.experiments.models import ServerConfig
from apps.experiments.recovery import recovery_options
from apps.experiments.spec_types import RecoverySpec
from apps.runs.ingest import metric_samples_ingest, records_writer
from apps.runs.models import Host, Run
from apps.runs.summary_types import RehearsalFacts, RehearsalWorkerFacts, RunSummary
from apps.workloads.services import trace_load
from workers.engine.launcher import HostConfig
from workers.engine.scrape import Scraper
from workers.engine.server import EngineError, EngineFailed, EngineServer, read_tail
from workers.replay.config import ReplayConfig
from workers.replay.result import ReplayResult
from workers.replay.run import run_replay
from workers.switch import Route, SwitchFailed, Switchover, route_resolve
from workers.watch import Outcome, RunWatcher

log = logging.getLogger(__name__)

# Time between fixing the replay's origin and the origin itself: the replay's own process
# must be up and its plan built before the first planned send.
ORIGIN_LEAD_S = 3.0
SCRAPE_INTERVAL_S = 1.0


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


def rehearsal_execute(
    run: Run,
    host: Host,
    *,
    model: str,
    controls: dict[str, Any],
    host_config: HostConfig,
    log_dir: Path,
    stop: threading.Event,
    watcher: RunWatcher,
) -> Outcome:
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
    facts: RehearsalWorkerFacts = {
        "standby": options["standby"],
        "split": split_note,
        "candidate_url": candidate.base_url,
        "b0_url": b0.base_url,
        "b0_cell": b0_cell.cell_id,
    }
    if route is not None:  # the operator's names, never the command or the address behind them
        facts["switch"], facts["router"] = route.switch, route.router

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
    facts: RehearsalWorkerFacts,
    stop: threading.Event,
    watcher: RunWatcher,
    *,
    cold: bool,
    track: Callable[[], None],
) -> Outcome:
    """Steps 3-4 once the candidate (and a warm B0) is up; step 5 is the caller's."""
    trace = trace_load(sha256=run.trace_sha256)
    requests = [r.to_json() for r in trace.requests]
    switch_s = float(cast(float, options["switch_at_s"]))  # recovery_options fills it from the windows
    router = route.url if route is not None else None
    timing = {"origin_ns": 0}  # fixed just before the replay starts, after the "before" scrapes
    clock = lambda: time.perf_counter_ns() - timing["origin_ns"]  # noqa: E731 - times from the replay's origin
    cand_scraper = Scraper(candidate.base_url, interval_s=SCRAPE_INTERVAL_S, clock=clock)
    b0_scraper = Scraper(b0.base_url, interval_s=SCRAPE_INTERVAL_S, clock=clock)
    switch = Switchover(
        run.pk,
        candidate,
        b0,
        route,
        facts,
        stop,
        switch_s=switch_s,
        cold=cold,
        track=track,
        b0_scraper=b0_scraper,
    )
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
    running = [cand_scraper] if cold else [cand_scraper, b0_scraper]
    for scraper in running:
        with contextlib.suppress(Exception):
            scraper.scrape("before")  # on the monotonic clock: moved onto the replay's below
    origin_ns = time.perf_counter_ns() + round(ORIGIN_LEAD_S * 1e9)
    timing["origin_ns"] = origin_ns
    for scraper in running:
        for sample in scraper.samples:
            sample["t_ns"] -= origin_ns
        scraper.start_during()
    switch.start(origin_ns)
    watcher.origin = time.monotonic() + ORIGIN_LEAD_S
    result: ReplayResult | None = None
    try:
        result = run_replay(
            requests, config, on_batch=records_writer(run_pk=run.pk), stop=stop, origin_ns=origin_ns
        )
    finally:
        seen = (
            result is not None
            and result.rehearsal is not None
            and result.rehearsal["b0_ready_at_s"] is not None
        )
        switch.finish(b0_seen_ready=seen)
        for who, scraper in (("", cand_scraper), ("b0", b0_scraper)):
            scraper.stop_during()
            with contextlib.suppress(Exception):
                scraper.scrape("after")
            scraper.close()
            metric_samples_ingest(run_pk=run.pk, samples=scraper.samples, server=who)
    summary: RunSummary = {**result.summary()}
    summary["rehearsal"] = cast(RehearsalFacts, {**facts, **(result.rehearsal or {})})
    summary["scrape_errors"] = (cand_scraper.errors + b0_scraper.errors)[:20]
    summary["servers"] = {"candidate": candidate.tracked_pids(), "b0": b0.tracked_pids()}
    fields = {
        **result.run_fields(),
        "generation": result.extra_body,
        "summary": summary,
        "log_tail": read_tail(candidate.log_path) + "\n--- B0 ---\n" + read_tail(b0.log_path),
    }
    return _judge(candidate, b0, result, switch.errors, watcher, fields, b0_stopped_by_us=switch.stopped_b0)


def _judge(
    candidate: EngineServer,
    b0: EngineServer,
    result: ReplayResult,
    side_errors: list[str],
    watcher: RunWatcher,
    fields: dict[str, Any],
    *,
    b0_stopped_by_us: bool = False,
) -> Outcome:
    """How the rehearsal ends: a failed switch command fails it first, then a cancel, a server
    that died, anything else that went wrong at the switch, a load generator that fell behind."""
    if side_errors and any("switch command" in e for e in side_errors):
        return Run.Status.FAILED, "; ".join(side_errors), fields
    if watcher.cancelled or result.stopped:
        return Run.Status.CANCELLED, "cancelled mid-run; partial records kept", fields
    for who, server in (("candidate", candidate), ("B0", b0)):
        if server is b0 and b0_stopped_by_us:
            continue  # the switch stopped a cold B0 still starting: its own error below says so
        death = server.failure() if server.proc is not None else None
        if death is not None:
            return Run.Status.FAILED, f"{who}: {death}", fields
    if side_errors:
        return Run.Status.FAILED, "; ".join(side_errors), fields
    if not result.valid:
        return Run.Status.INVALID, result.invalid_reason, fields
    return Run.Status.DONE, "", fields
