"""One run, end to end, on the host whose worker executes it.

Steps of :func:`run_execute`:

1. Claim the run (queued -> starting, a conditional update) and lease the
   host; a run that is past ``queued`` is left alone, so a redelivered task is
   harmless.
2. Start the candidate (:class:`workers.engine.server.EngineServer`), record
   its pids on the host row so a restarted worker can reap them, confirm the
   effective args (a mismatch makes the run ``invalid``), warm it up.
3. Replay the frozen trace named by the run's hash, open loop. Records reach
   the database in batches about every second while the run goes on; a
   watcher moves the status warming -> measuring -> draining by the trace's
   windows and stops everything within a second of a cancel.
4. Scrape /metrics before, during and after; stop the server (TERM, then
   KILL); mark the run done, invalid (load generator fell behind, args
   differ) or failed (with the reason and vLLM's last log lines).
5. Release the lease; after the experiment's last run, queue the analysis.

Whatever goes wrong, the run ends in a finished status with a reason and its
records so far are kept.

:func:`host_pull` is what a host's worker runs when woken: it claims runnable runs one
after another (apps/runs/scheduling.py) until none is left. With engine reuse it keeps the
server of one cell and round up in a :class:`ServerSlot` and replays that cell's traces
back to back: a reused server skips the start, the confirmation is the start's own, and an
idle check (workers/engine/idle.py) replaces the warm-up; a server not idle makes the run
``invalid``. The slot stops the server when the next run is another cell or round, when a
run on it did not end done or invalid, and when the pull ends. Each run records its engine
time (start, warm-up, idle check, windows, drain, stop) in ``summary["engine_time"]``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from apps.experiments.generation import request_sampling
from apps.experiments.models import Experiment, ServerConfig
from apps.runs.hosts import host_register_local
from apps.runs.ingest import metric_samples_ingest, records_writer
from apps.runs.models import Host, Run
from apps.runs.scheduling import reuse_enabled, run_claim_next
from apps.runs.services import experiment_check_finished, host_lease, host_release, run_claim
from apps.workloads.services import tokenizer_dir, trace_load
from workers.engine.confirm import local_hardware_id
from workers.engine.gauges import latest_gauges
from workers.engine.idle import idle_check as _idle_check
from workers.engine.idle import not_idle_reason
from workers.engine.launcher import HostConfig, LaunchError
from workers.engine.procs import proc_info
from workers.engine.server import EngineError, EngineInvalid, EngineServer, read_tail
from workers.quality import sweep_probe
from workers.rehearsal import rehearsal_execute
from workers.replay.config import ReplayConfig
from workers.replay.run import processes_for, run_replay
from workers.slot import ServerSlot

log = logging.getLogger(__name__)

WARMUP_REQUESTS = 4
IDLE_TIMEOUT_S = 30.0  # how long a reused server may take to go idle before its run is invalid
WATCH_INTERVAL_S = 0.5
LIVE_EVERY_S = 2.0


class RunCancelled(Exception):
    pass


def run_controls(experiment: Experiment, cell: ServerConfig | None = None) -> dict[str, Any]:
    """The frozen controls as launcher keys (identical for every cell of the experiment), with
    the model revision of a candidate whose spec names its own."""
    return {
        **experiment.controls(),
        "revision": cell.revision(experiment) if cell is not None else experiment.model_revision,
        "tokenizer_revision": experiment.tokenizer_revision,
    }


class EngineUnavailable(ValueError):
    """The host cannot start the engine build a candidate names: the run fails before starting."""


def host_config(host: Host, cell: ServerConfig | None = None, *, dev_mode: bool = False) -> HostConfig:
    """How this host starts a cell's server: its own command, or the one it lists for the
    candidate's ``engine.image`` (TAILTUNE_VLLM_COMMANDS). ``dev_mode``: vLLM's development
    endpoints on (``/reset_prefix_cache``, for a reused server with prefix caching), which the
    launcher refuses unless the host binds loopback. The model must lie under this worker's own
    TAILTUNE_MODEL_ROOTS (not the host row's, which anyone with the admin could edit)."""
    command, digest = tuple(host.vllm_command), host.image_digest
    image = cell.engine_image if cell is not None else ""
    if image:
        other = (host.engines or {}).get(image)
        if not other:
            known = ", ".join(sorted(host.engines or {})) or "none"
            raise EngineUnavailable(
                f"host {host.name} has no engine for image {image!r} (it lists: {known}); "
                "name it in the worker's TAILTUNE_VLLM_COMMANDS"
            )
        command, digest = tuple(other), ""  # the engine records its own version and digest
    return HostConfig(
        vllm_command=command,
        bind_host=host.bind_host,
        devices=host.devices,
        image_digest=digest,
        dev_mode=dev_mode,
        model_roots=tuple(settings.TAILTUNE_MODEL_ROOTS),
    )


def _is_cancelled(run_pk: int) -> bool:
    run = Run.objects.filter(pk=run_pk).values("status", "experiment__status").first()
    return run is None or run["status"] == Run.Status.CANCELLED or run["experiment__status"] == "cancelled"


def _finish(run_pk: int, status: str, reason: str = "", **fields: Any) -> bool:
    """Move the run to a finished status unless something else (recovery, a cancel) already did."""
    updated = Run.objects.filter(pk=run_pk).exclude(status__in=Run.FINISHED - {Run.Status.CANCELLED})
    if status != Run.Status.CANCELLED:
        updated = updated.exclude(status=Run.Status.CANCELLED)
    return updated.update(status=status, reason=reason, finished_at=timezone.now(), **fields) == 1


def _set_phase(run_pk: int, status: str) -> None:
    fields: dict[str, Any] = {"status": status, "updated_at": timezone.now()}
    if status == Run.Status.MEASURING:
        fields["measuring_at"] = timezone.now()
    Run.objects.filter(pk=run_pk, status__in=Run.ACTIVE).update(**fields)


class _Watcher(threading.Thread):
    """Polls for a cancel and advances the phase by the trace's windows."""

    def __init__(self, run: Run, stop: threading.Event, server: EngineServer | None) -> None:
        super().__init__(name=f"run-{run.pk}-watch", daemon=True)
        self.run_pk = run.pk
        self.stop_event = stop
        self.server = server
        self.origin: float | None = None  # monotonic time of the replay's start
        self.warmup_s = run.warmup_seconds
        self.observation_s = run.observation_seconds
        self.cancelled = False
        self._done = threading.Event()
        self._phase = ""
        # Set once the replay starts: the live page's gauges and log tail come from these.
        self.scraper: Any = None
        self.log_path: Path | None = None
        self._live_at = 0.0

    def run(self) -> None:
        try:
            while not self._done.wait(WATCH_INTERVAL_S):
                try:
                    if self._tick():
                        return
                except DatabaseError:
                    # A dropped connection (seen in CI: "server closed the connection
                    # unexpectedly") must not end the watch, or a later cancel goes unseen:
                    # drop the broken connection, as the heartbeat does, and look again at the
                    # next tick (a phase not yet written is written then).
                    log.warning("run %s: the watch could not read or write the run; retrying",
                                self.run_pk, exc_info=True)  # fmt: skip
                    close_old_connections()
        finally:
            close_old_connections()

    def _tick(self) -> bool:
        """One look at the run: True once it is cancelled (the watch then ends)."""
        if _is_cancelled(self.run_pk):
            self.cancelled = True
            self.stop_event.set()
            if self.origin is None and self.server is not None:
                self.server.stop()  # still starting: do not wait for it
            return True
        if self.origin is not None:
            elapsed = time.monotonic() - self.origin
            phase = Run.Status.WARMING
            if elapsed >= self.warmup_s:
                phase = Run.Status.MEASURING
            if elapsed >= self.warmup_s + self.observation_s:
                phase = Run.Status.DRAINING
            if phase != self._phase:
                _set_phase(self.run_pk, phase)
                self._phase = phase
            if time.monotonic() - self._live_at >= LIVE_EVERY_S:
                self._live_at = time.monotonic()
                try:
                    self.publish_live()
                except Exception:  # the live view is a courtesy: never stop watching for a cancel
                    log.exception("run %s: publishing live values failed", self.run_pk)
        return False

    def publish_live(self) -> None:
        """The newest gauges the scraper saw and the server log's tail, for the live page."""
        fields: dict[str, Any] = {}
        if self.scraper is not None:
            fields["live"] = {"gauges": latest_gauges(list(self.scraper.samples[-400:])), "at": time.time()}
        if self.log_path is not None:
            fields["log_tail"] = read_tail(self.log_path)
        if fields:
            Run.objects.filter(pk=self.run_pk, status__in=Run.ACTIVE).update(**fields)

    def finish(self) -> None:
        self._done.set()
        self.join(timeout=5)


def this_host() -> Host:
    """This machine's host row, registered with its hardware id."""
    return host_register_local(hardware_id=local_hardware_id())


def run_execute(*, run_pk: int) -> str:
    """Execute one run by its key, on a server of its own (see the module docstring);
    returns its final status. The capacity probe and the tests call this directly."""
    host = this_host()
    run = run_claim(run_pk=run_pk, host=host)
    if run is None:
        status = Run.objects.filter(pk=run_pk).values_list("status", flat=True).first()
        log.info("run %s not claimed (status %s): nothing to do", run_pk, status)
        return f"skipped ({status})"
    slot = ServerSlot(host)
    try:
        return _execute_claimed(run, host, slot)
    finally:
        slot.close()


def host_pull(
    *,
    host: Host | None = None,
    limit: int | None = None,
    execute: Callable[[Run, Host, ServerSlot], str] | None = None,
) -> list[tuple[int, str]]:
    """Claim and execute runnable runs until none is left (or ``limit`` were done); returns
    (run pk, final status) in the order run. One server at a time, kept up across a cell's
    round when the experiment reuses engines. ``host`` defaults to this machine's;
    ``execute`` (tests) replaces the run's execution, the lease and the checks around it stay."""
    host = host or this_host()
    slot = ServerSlot(host)
    done: list[tuple[int, str]] = []
    try:
        while limit is None or len(done) < limit:
            run = run_claim_next(host=host)
            if run is None:
                break
            done.append((run.pk, _execute_claimed(run, host, slot, execute=execute)))
    finally:
        slot.close()
    return done


def _execute_claimed(
    run: Run, host: Host, slot: ServerSlot, *, execute: Callable[[Run, Host, ServerSlot], str] | None = None
) -> str:
    """Lease the host for a claimed run, execute it, release; after the run, skip what its
    cell can no longer win (apps/runs/early_stop.py) and queue the analysis after the last."""
    if not host_lease(host=host, run=run):
        holder = Host.objects.filter(pk=host.pk).values_list("current_run", flat=True).first()
        _finish(
            run.pk, Run.Status.FAILED, f"host {host.name} is serving run {holder}; one candidate at a time"
        )
        return Run.Status.FAILED
    me = proc_info(os.getpid())
    Host.objects.filter(pk=host.pk).update(
        worker_pid=os.getpid(), worker_pid_start=me.start_ticks if me is not None else None
    )
    try:
        return (execute or _execute)(run, host, slot)
    finally:
        if slot.server is None:
            Host.objects.filter(pk=host.pk).update(server_pids=[], worker_pid=None, worker_pid_start=None)
        host_release(host=host, run=run)
        if run.kind == Run.Kind.SWEEP:
            try:
                from apps.runs.early_stop import experiment_skip_after_invalid, experiment_skip_doomed

                experiment_skip_after_invalid(experiment_id=run.experiment_id, run_pk=run.pk)
                experiment_skip_doomed(experiment_id=run.experiment_id, cell_id=run.cell.cell_id)
            except Exception:  # early stopping saves time; a failure here must not lose the run
                log.exception("early stopping check of experiment %s failed", run.experiment_id)
        experiment_check_finished(experiment_id=run.experiment_id)


def _execute(run: Run, host: Host, slot: ServerSlot) -> str:
    experiment = run.experiment
    log_path = Path(settings.DATA_DIR) / "runs" / str(run.run_id) / "server.log"
    Run.objects.filter(pk=run.pk).update(log_path=str(log_path))
    stop = threading.Event()
    model = str(tokenizer_dir(experiment.model_path))
    if run.kind == Run.Kind.REHEARSAL:
        slot.close()  # a rehearsal starts two servers of its own; one candidate at a time
        if run.cell.engine:
            _finish(run.pk, Run.Status.FAILED, "refused before start: a rollback rehearsal of a candidate "
                    "that is another engine build or model revision is not supported yet")  # fmt: skip
            return Run.Status.FAILED
        watcher = _Watcher(run, stop, None)

        def body() -> tuple[str, str, dict[str, Any]]:
            return rehearsal_execute(
                run,
                host,
                model=model,
                controls=run_controls(experiment),
                host_config=host_config(host),
                log_dir=log_path.parent,
                stop=stop,
                watcher=watcher,
            )
    else:
        reuse = run.kind == Run.Kind.SWEEP and reuse_enabled(experiment)
        key = (run.experiment_id, run.cell_id, run.repeat)
        kept = slot.take(key) if reuse else None
        if kept is None:
            slot.close()
            try:
                server = EngineServer(
                    model=model,
                    cell_args=run.cell.args,
                    controls=run_controls(experiment, run.cell),
                    host=host_config(host, run.cell, dev_mode=reuse and experiment.enable_prefix_caching),
                    log_path=log_path,
                )
            except ValueError as exc:  # LaunchError: a disallowed flag, refused before anything starts
                _finish(run.pk, Run.Status.FAILED, f"refused before start: {exc}")
                return Run.Status.FAILED
        else:
            server = kept
            Run.objects.filter(pk=run.pk).update(log_path=str(server.log_path))
        watcher = _Watcher(run, stop, server)

        def body() -> tuple[str, str, dict[str, Any]]:
            if not reuse:
                with server:
                    outcome = _with_server(run, host, server, watcher, stop, slot=None)
                    began = time.monotonic()
                    server.stop()  # the server is gone before the run says it is finished
                    _engine_time(outcome[2])["stop_s"] = round(time.monotonic() - began, 3)
                return outcome
            try:
                outcome = _with_server(run, host, server, watcher, stop, slot=slot)
            except BaseException:
                slot.server, slot.last_run_pk = server, run.pk
                slot.close()
                raise
            slot.keep(key, server, run, new=kept is None)
            status, fields = outcome[0], outcome[2]
            not_idle = not (fields.get("summary", {}).get("idle_check") or {}).get("idle", True)
            # A server that died, a run that failed or was cancelled, or a server that would not go
            # idle is not trusted with the cell's next trace: stop it now, on this run's account.
            if (
                status not in (Run.Status.DONE, Run.Status.INVALID)
                or not_idle
                or server.failure() is not None
            ):
                _engine_time(fields)["stop_s"] = round(slot.close(record=False), 3)
            return outcome

    watcher.start()
    try:
        status, reason, fields = body()
    except LaunchError as exc:  # a rehearsal's servers: a disallowed flag, refused before anything starts
        status, reason, fields = Run.Status.FAILED, f"refused before start: {exc}", {}
    except RunCancelled:
        status, reason, fields = Run.Status.CANCELLED, "cancelled before the replay started", {}
    except EngineError as exc:
        status, reason, fields = exc.outcome, exc.reason, {"log_tail": exc.log_tail}
        if watcher.cancelled:
            status, reason = Run.Status.CANCELLED, "cancelled while the server was starting"
        elif isinstance(exc, EngineInvalid):
            fields.update(exc.facts.run_fields())
    except Exception as exc:  # a bug or an outage: the run fails with the reason, never vanishes
        log.exception("run %s crashed", run.pk)
        status = Run.Status.FAILED
        reason = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        fields = {"log_tail": read_tail(log_path)}
    finally:
        watcher.finish()
    _finish(run.pk, status, reason, **fields)
    return status


def _engine_time(fields: dict[str, Any]) -> dict[str, Any]:
    summary = fields.setdefault("summary", {})
    spent: dict[str, Any] = summary.setdefault("engine_time", {})
    return spent


def _with_server(
    run: Run,
    host: Host,
    server: EngineServer,
    watcher: _Watcher,
    stop: threading.Event,
    *,
    slot: ServerSlot | None,
) -> tuple[str, str, dict[str, Any]]:
    """Steps 2-4 with a server (started here, or kept up by ``slot`` from the cell's last run);
    returns (status, reason, run fields) to finish with."""
    from workers.engine.scrape import Scraper

    spent: dict[str, Any] = {}
    reused = slot is not None and slot.server is server
    began = time.monotonic()
    if not reused:
        server.start()
        Host.objects.filter(pk=host.pk).update(server_pids=server.tracked_pids())
        Run.objects.filter(pk=run.pk).update(server_pid=server.pgid)
        facts = server.confirm()
        spent["start_s"] = round(time.monotonic() - began, 3)
    else:
        assert server.facts is not None  # confirmed when it started
        facts = server.facts
        Run.objects.filter(pk=run.pk).update(server_pid=server.pgid)
    Run.objects.filter(pk=run.pk).update(**facts.run_fields())
    if watcher.cancelled:
        raise RunCancelled
    _set_phase(run.pk, Run.Status.WARMING)
    server_facts = {"reused": reused, "started_by": slot.started_by if reused and slot else str(run.run_id)}
    if not reused:
        began = time.monotonic()
        server.warm_up(n=WARMUP_REQUESTS)
        spent["warmup_s"] = round(time.monotonic() - began, 3)
    check: dict[str, Any] | None = None
    if slot is not None:
        # A new server measures its idle KV level; a reused one must be back to it.
        began = time.monotonic()
        check = _idle_check(
            server.base_url,
            kv_idle=slot.kv_idle if reused else None,
            reset_prefix_cache=reused and run.experiment.enable_prefix_caching,
            timeout_s=IDLE_TIMEOUT_S,
        )
        spent["idle_check_s"] = round(time.monotonic() - began, 3)
        if not reused and check["idle"]:
            slot.kv_idle = check.get("kv_usage")
        if not check["idle"]:
            partial: dict[str, Any] = {"idle_check": check, "server": server_facts, "engine_time": spent}
            if reused:
                return Run.Status.INVALID, not_idle_reason(check), {"summary": partial}
            return (
                Run.Status.FAILED,
                "the new server did not go idle after its warm-up: " + not_idle_reason(check),
                {"summary": partial},
            )
    began = time.monotonic()
    probe = sweep_probe(run, server, stop)
    if probe is not None:
        spent["warmup_s"] = round(float(spent.get("warmup_s") or 0.0) + time.monotonic() - began, 3)

    trace = trace_load(sha256=run.trace_sha256)
    requests = [r.to_json() for r in trace.requests]
    on_batch = records_writer(run_pk=run.pk)
    scraper = Scraper(server.base_url, interval_s=2.0)
    try:
        try:
            scraper.scrape("before")
        except Exception as exc:  # scraping is evidence, not a precondition
            scraper.errors.append(f"before: {exc}")
        scraper.start_during()
        watcher.scraper, watcher.log_path = scraper, server.log_path
        watcher.origin = time.monotonic()
        workload = run.experiment.workload
        config = ReplayConfig(
            base_url=server.base_url,
            model=server.served_model_name,
            run_id=str(run.run_id),
            warmup_s=run.warmup_seconds,
            observation_s=run.observation_seconds,
            drain_deadline_s=run.drain_deadline_seconds,
            max_dispatch_lag_ms=workload.max_dispatch_lag_ms,
            extra_body=request_sampling(run.experiment.generation),
            output_mode=workload.output_mode,
            processes=processes_for(requests),
            isolated=True,
        )
        result = run_replay(requests, config, on_batch=on_batch, stop=stop)
        scraper.stop_during()
        try:
            scraper.scrape("after")
        except Exception as exc:
            scraper.errors.append(f"after: {exc}")
    finally:
        scraper.close()
        metric_samples_ingest(run_pk=run.pk, samples=scraper.samples)

    summary = result.summary()
    windows = float(run.warmup_seconds) + float(run.observation_seconds)
    spent["windows_s"] = round(min(result.duration_s, windows), 3)
    spent["drain_s"] = round(max(0.0, result.duration_s - windows), 3)
    summary["engine_time"] = spent
    summary["server"] = server_facts
    if check is not None:
        summary["idle_check"] = check
    if probe is not None:
        summary["quality_probe"] = probe
    summary["scrape_errors"] = scraper.errors[:20]
    summary["restarts_t_ns"] = scraper.restarts
    fields = {
        **result.run_fields(),
        "generation": result.extra_body,
        "summary": summary,
        "log_tail": read_tail(server.log_path),
    }
    if watcher.cancelled or result.stopped:
        return Run.Status.CANCELLED, "cancelled mid-run; partial records kept", fields
    death = server.failure()
    if death is not None:
        return Run.Status.FAILED, death, fields
    if not result.valid:
        return Run.Status.INVALID, result.invalid_reason, fields
    _set_phase(run.pk, Run.Status.DRAINING)
    return Run.Status.DONE, "", fields
