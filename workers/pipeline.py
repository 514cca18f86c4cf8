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
4. Scrape /metrics before, during and after; join the server's spans of the
   run's requests to its records (workers/server_timings.py); stop the server
   (TERM, then KILL); mark the run done, invalid (load generator fell behind,
   its loop or the scraper stalled past tolerance, args differ) or failed (with
   the reason and vLLM's last log lines).
5. Release the lease; after a search's screening run, score its trial and take the search's
   next step (apps/lifecycle/search_steps.py); after the experiment's last run, queue the
   analysis.

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

Over 500 lines on purpose: a run's claim, its server's life, its replay and the way it ends
(with every failure kept as a finished status and its reason) are one sequence that a reader
checking "a measurement is never lost" must follow end to end in one file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.analysis.run_digest import run_digest_build
from apps.analysis.validity import gaps_summary
from apps.experiments.generation import request_sampling
from apps.experiments.models import Experiment, ServerConfig
from apps.lifecycle.completion import experiment_check_finished
from apps.lifecycle.search_steps import search_after_run
from apps.runs.hosts import host_register_local
from apps.runs.ingest import metric_samples_ingest, records_writer
from apps.runs.models import Host, Run
from apps.runs.scheduling import SERIES_KINDS, reuse_enabled, run_claim_next
from apps.runs.services import host_lease, host_release, run_claim
from apps.runs.summary_types import EngineTime, PreReplaySummary, RunSummary, ServerReuse, run_summary
from apps.workloads.models import Trace
from apps.workloads.services import tokenizer_dir, trace_load
from workers.engine.confirm import local_hardware_id
from workers.engine.idle import IdleCheck, not_idle_reason
from workers.engine.idle import idle_check as _idle_check
from workers.engine.launcher import HostConfig, LaunchError
from workers.engine.procs import proc_info
from workers.engine.scrape import Scraper
from workers.engine.server import EngineError, EngineInvalid, EngineServer, read_tail
from workers.engine.tokenizer_pin import tokenizer_mismatch
from workers.quality_probe import sweep_probe
from workers.rehearsal_run import rehearsal_execute
from workers.replay.config import ReplayConfig
from workers.replay.result import ReplayResult
from workers.replay.run import processes_for, run_replay
from workers.server_timings import run_server_spans
from workers.slot import ServerSlot, slot_key
from workers.watch import Outcome, RunWatcher, advance_phase

log = logging.getLogger(__name__)

WARMUP_REQUESTS = 4
# The runs that may replay on a server kept from the run before (engine reuse, idle-checked), each
# in its own series (workers/slot.py ``slot_key``). Not the failure scenarios: in the reference
# sweep's one run with them reused, a scenario after kv_pressure on the same server failed; each
# starts its own server until that is understood. Nor the rehearsal, whose servers are its own.
# The series a host reserves (apps/runs/scheduling.py), and the probes run inline.
REUSING_KINDS = SERIES_KINDS | Run.PROBES
IDLE_TIMEOUT_S = 30.0  # how long a reused server may take to go idle before its run is invalid


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


def host_config(
    host: Host, cell: ServerConfig | None = None, *, dev_mode: bool = False, server_spans: bool | None = None
) -> HostConfig:
    """How this host starts a cell's server: its own command, or the one it lists for the
    candidate's ``engine.image`` (TAILTUNE_VLLM_COMMANDS). ``dev_mode``: vLLM's development
    endpoints on (``/reset_prefix_cache``, for a reused server with prefix caching), which the
    launcher refuses unless the host binds loopback. The model must lie under this worker's own
    TAILTUNE_MODEL_ROOTS (not the host row's, which anyone with the admin could edit).
    ``server_spans``: the server traces its requests to the worker (default: this worker's
    TAILTUNE_SERVER_SPANS)."""
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
        server_spans=settings.TAILTUNE_SERVER_SPANS if server_spans is None else server_spans,
    )


def _finish(run_pk: int, status: str, reason: str = "", **fields: Any) -> bool:
    """Move the run to a finished status unless something else (recovery, a cancel) already did."""
    updated = Run.objects.filter(pk=run_pk).exclude(status__in=Run.FINISHED - {Run.Status.CANCELLED})
    if status != Run.Status.CANCELLED:
        updated = updated.exclude(status=Run.Status.CANCELLED)
    finished = updated.update(status=status, reason=reason, finished_at=timezone.now(), **fields) == 1
    if finished and status == Run.Status.DONE:
        _pack_digest(run_pk)
    return finished


def _pack_digest(run_pk: int) -> None:
    """Pack the done run's records for the report now (apps/analysis/run_digest.py), while the host
    has them fresh; a failure here costs the report that rebuild later, never the run."""
    try:
        run_digest_build(run_pk=run_pk)
    except Exception:
        log.exception("run %s: its digest was not packed (the report packs it)", run_pk)


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


@contextmanager
def inline_executor() -> Iterator[Callable[..., str]]:
    """``run_execute`` for a series of inline probe runs (the capacity probe's steps, a goodput
    search, B0's pace probe), keeping one server up between the runs of one cell: the probe's
    steps replay back to back on it, each after an idle check, as a sweep round's runs do with
    engine reuse (apps/runs/scheduling.py ``reuse_enabled``). The server stops when the block ends."""
    host = this_host()
    slot = ServerSlot(host)

    def execute(*, run_pk: int) -> str:
        host = this_host()  # registering again keeps the heartbeat fresh through a long probe
        run = run_claim(run_pk=run_pk, host=host)
        if run is None:
            status = Run.objects.filter(pk=run_pk).values_list("status", flat=True).first()
            return f"skipped ({status})"
        return _execute_claimed(run, host, slot)

    try:
        yield execute
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
    cell can no longer win (apps/lifecycle/run_skipping.py) and queue the analysis after the last."""
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
                from apps.lifecycle.run_skipping import experiment_skip_after_invalid, experiment_skip_doomed

                experiment_skip_after_invalid(experiment_id=run.experiment_id, run_pk=run.pk)
                experiment_skip_doomed(experiment_id=run.experiment_id, cell_id=run.cell.cell_id)
            except Exception:  # early stopping saves time; a failure here must not lose the run
                log.exception("early stopping check of experiment %s failed", run.experiment_id)
        if run.kind == Run.Kind.SCREEN:
            # A search's trial scored and its next step taken (the next trial, or the
            # confirmation rounds) before the check below, so the analysis is never sent
            # between the screening and the confirmation. It records its own failures.
            try:
                search_after_run(run_id=run.pk)
            except Exception:
                log.exception("the search step after run %s failed", run.pk)
        experiment_check_finished(experiment_id=run.experiment_id)


def _execute(run: Run, host: Host, slot: ServerSlot) -> str:
    experiment = run.experiment
    log_path = Path(settings.DATA_DIR) / "runs" / str(run.run_id) / "server.log"
    Run.objects.filter(pk=run.pk).update(log_path=str(log_path))
    stop = threading.Event()
    model = str(tokenizer_dir(experiment.model_path))
    trace_meta = Trace.objects.filter(sha256=run.trace_sha256).values_list("meta", flat=True).first()
    mismatch = tokenizer_mismatch(trace_meta or {}, model)
    if mismatch is not None:
        _finish(run.pk, Run.Status.FAILED, f"refused before start: {mismatch}")
        return Run.Status.FAILED
    if run.kind == Run.Kind.REHEARSAL:
        slot.close()  # a rehearsal starts two servers of its own; one candidate at a time
        if run.cell.engine:
            _finish(run.pk, Run.Status.FAILED, "refused before start: a rollback rehearsal of a candidate "
                    "that is another engine build or model revision is not supported yet")  # fmt: skip
            return Run.Status.FAILED
        watcher = RunWatcher(run, stop, None)

        def body() -> Outcome:
            return rehearsal_execute(
                run,
                host,
                model=model,
                controls=run_controls(experiment),
                # Its two servers are measured by the switch, not split per request.
                host_config=host_config(host, server_spans=False),
                log_dir=log_path.parent,
                stop=stop,
                watcher=watcher,
            )
    else:
        reuse = run.kind in REUSING_KINDS and reuse_enabled(experiment)
        # A sweep keeps its server for one cell and round; the uniform companions
        # and the inline probes (run by inline_executor) each for one cell, apart from the rest.
        key = slot_key(run)
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
        watcher = RunWatcher(run, stop, server)

        def body() -> Outcome:
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
            check = run_summary(fields.get("summary")).get("idle_check")
            not_idle = check is not None and not check["idle"]
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


def _engine_time(fields: dict[str, Any]) -> EngineTime:
    summary = fields.setdefault("summary", {})
    spent: EngineTime = summary.setdefault("engine_time", {})
    return spent


def _seconds_since(began: float) -> float:
    return round(time.monotonic() - began, 3)


def _with_server(
    run: Run,
    host: Host,
    server: EngineServer,
    watcher: RunWatcher,
    stop: threading.Event,
    *,
    slot: ServerSlot | None,
) -> Outcome:
    """Steps 2-4 with a server (started here, or kept up by ``slot`` from the cell's last run);
    returns (status, reason, run fields) to finish with."""
    spent: EngineTime = {}
    reused = slot is not None and slot.server is server
    _bring_up(run, host, server, spent, reused=reused)
    if watcher.cancelled:
        raise RunCancelled
    advance_phase(run.pk, Run.Status.WARMING)
    server_facts: ServerReuse = {
        "reused": reused,
        "started_by": slot.started_by if reused and slot else str(run.run_id),
    }
    if not reused:
        began = time.monotonic()
        server.warm_up(n=WARMUP_REQUESTS)
        spent["warmup_s"] = _seconds_since(began)
    check: IdleCheck | None = None
    if slot is not None:
        check = _check_idle(run, server, slot, spent, reused=reused)
        if not check["idle"]:
            return _not_idle(check, server_facts, spent, reused=reused)
    began = time.monotonic()
    probe = sweep_probe(run, server, stop)
    if probe is not None:
        spent["warmup_s"] = round(float(spent.get("warmup_s") or 0.0) + time.monotonic() - began, 3)
    result, scraper = _replay_scraped(run, server, watcher, stop)
    summary: RunSummary = {
        **result.summary(),
        "engine_time": _windows_time(spent, run, result),
        "server": server_facts,
        "server_spans": run_server_spans(run, server, result),
    }
    if check is not None:
        summary["idle_check"] = check
    if probe is not None:
        summary["quality_probe"] = probe
    summary["scrape_errors"] = scraper.errors[:20]
    summary["restarts_t_ns"] = scraper.restarts
    summary["scrape_gap_max_s"] = scraper.gap_max_s()
    summary["measurement_gaps"] = gaps_summary(
        loop_stall_max_ms=result.loop_stall_max_ms,
        scrape_gap_max_s=summary["scrape_gap_max_s"],
        max_dispatch_lag_ms=run.experiment.workload.max_dispatch_lag_ms,
    )
    fields = {
        **result.run_fields(),
        "generation": result.extra_body,
        "summary": summary,
        "log_tail": read_tail(server.log_path),
    }
    return _judge(run, server, watcher, result, fields)


def _bring_up(run: Run, host: Host, server: EngineServer, spent: EngineTime, *, reused: bool) -> None:
    """Step 2: start a new server and confirm its args (a kept one was confirmed at its start);
    the run and the host record its pids, the run its effective args."""
    if not reused:
        began = time.monotonic()
        server.start()
        Host.objects.filter(pk=host.pk).update(server_pids=server.tracked_pids())
        Run.objects.filter(pk=run.pk).update(server_pid=server.pgid)
        facts = server.confirm()
        spent["start_s"] = _seconds_since(began)
    else:
        assert server.facts is not None  # confirmed when it started
        facts = server.facts
        Run.objects.filter(pk=run.pk).update(server_pid=server.pgid)
    Run.objects.filter(pk=run.pk).update(**facts.run_fields())


def _check_idle(
    run: Run, server: EngineServer, slot: ServerSlot, spent: EngineTime, *, reused: bool
) -> IdleCheck:
    """Engine reuse: a new server measures its idle KV level (kept in the slot); a reused one must
    be back to it, its prefix cache reset where prefix caching is on."""
    began = time.monotonic()
    check = _idle_check(
        server.base_url,
        kv_idle=slot.kv_idle if reused else None,
        reset_prefix_cache=reused and run.experiment.enable_prefix_caching,
        timeout_s=IDLE_TIMEOUT_S,
    )
    spent["idle_check_s"] = _seconds_since(began)
    if not reused and check["idle"]:
        slot.kv_idle = check.get("kv_usage")
    return check


def _not_idle(check: IdleCheck, server: ServerReuse, spent: EngineTime, *, reused: bool) -> Outcome:
    """The run ends before its replay: invalid on a reused server, failed on a new one."""
    partial: PreReplaySummary = {"idle_check": check, "server": server, "engine_time": spent}
    if reused:
        return Run.Status.INVALID, not_idle_reason(check), {"summary": partial}
    return (
        Run.Status.FAILED,
        "the new server did not go idle after its warm-up: " + not_idle_reason(check),
        {"summary": partial},
    )


def _replay_scraped(
    run: Run, server: EngineServer, watcher: RunWatcher, stop: threading.Event
) -> tuple[ReplayResult, Scraper]:
    """Step 3 with step 4's scrapes around it: the run's frozen trace, open loop, in a process
    of its own; /metrics before, every 2 s during (stored as they come) and after."""
    trace = trace_load(sha256=run.trace_sha256)
    requests = [r.to_json() for r in trace.requests]
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
    scraper = Scraper(server.base_url, interval_s=2.0)
    try:
        try:
            scraper.scrape("before")
        except Exception as exc:  # scraping is evidence, not a precondition
            scraper.errors.append(f"before: {exc}")
        scraper.start_during()
        watcher.scraper, watcher.log_path = scraper, server.log_path
        watcher.origin = time.monotonic()
        result = run_replay(requests, config, on_batch=records_writer(run_pk=run.pk), stop=stop)
        scraper.stop_during()
        try:
            scraper.scrape("after")
        except Exception as exc:
            scraper.errors.append(f"after: {exc}")
    finally:
        scraper.close()
        metric_samples_ingest(run_pk=run.pk, samples=scraper.samples)
    return result, scraper


def _windows_time(spent: EngineTime, run: Run, result: ReplayResult) -> EngineTime:
    """The engine's time with the replay's: its windows, and the drain past them."""
    windows = float(run.warmup_seconds) + float(run.observation_seconds)
    spent["windows_s"] = round(min(result.duration_s, windows), 3)
    spent["drain_s"] = round(max(0.0, result.duration_s - windows), 3)
    return spent


def _judge(
    run: Run, server: EngineServer, watcher: RunWatcher, result: ReplayResult, fields: dict[str, Any]
) -> Outcome:
    """How the run ends: cancelled, failed (the server died), invalid (the load generator fell
    behind, or the client's loop or the scraper stalled past tolerance: ``measurement_gaps``) or
    done."""
    if watcher.cancelled or result.stopped:
        return Run.Status.CANCELLED, "cancelled mid-run; partial records kept", fields
    death = server.failure()
    if death is not None:
        return Run.Status.FAILED, death, fields
    gaps = run_summary(fields.get("summary")).get("measurement_gaps")
    reasons = [result.invalid_reason] if not result.valid else []
    reasons += gaps["problems"] if gaps else []
    if reasons:
        return Run.Status.INVALID, "; ".join(reasons), fields
    advance_phase(run.pk, Run.Status.DRAINING)
    return Run.Status.DONE, "", fields
