"""Start, confirm, warm up and stop one vLLM server for one run.

The orchestration (a Celery task on the host's queue) uses :class:`EngineServer`::

    host = cpu_engine_host(Path(".engine"))          # or HostConfig(...) for a GPU host
    server = EngineServer(
        model="/abs/path/or/hub-id",
        cell_args={"max_num_batched_tokens": 2048, "max_num_seqs": 16},
        controls={"max_model_len": 8192, "kv_cache_memory_bytes": 64 << 20, ...},
        host=host,
        log_path=run_dir / "server.log",
    )
    try:
        with server:                        # stop() on exit, whatever happened
            server.start()                  # EngineFailed: died or never healthy
            host_row.server_pids = server.tracked_pids()   # for reap_pids() after a crash
            facts = server.confirm()        # EngineInvalid: effective args differ
            server.warm_up(n=4)             # excluded from results
            ...                             # replay + Scraper(server.base_url)
            server.check_alive()            # EngineFailed if it died mid-run
    except EngineFailed as exc:   failed run, reason=exc.reason, log_tail=exc.log_tail
    except EngineInvalid as exc:  invalid run, reason=exc.reason, exc.facts.effective_args

Constructing the server validates the command (:class:`LaunchError` /
:class:`DisallowedFlag` before anything starts). ``confirm()`` returns
:class:`ServerFacts`: effective_args, vllm_version, image_digest,
model_revision, tokenizer_revision, hardware_id - the Run's fields.

No orphans: the server runs under ``guard.py`` as leader of its own process
group; the guard stops the group when the worker dies (its stdin pipe closes),
``stop()`` sends SIGTERM to the group then SIGKILL after ``grace_s``, and
``tracked_pids()`` lets a restarted worker reap leftovers with
:func:`workers.engine.procs.reap_pids`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from workers.engine import procs
from workers.engine.confirm import (
    Confirmation,
    check_revisions,
    compare_effective,
    hardware_id,
    local_install_digest,
    parse_non_default_args,
)
from workers.engine.launcher import HostConfig, LaunchPlan, build_launch
from workers.engine.scrape import parse_metrics
from workers.engine.spans import SpanReceiver
from workers.engine.tinymodel import read_revisions

GUARD = Path(__file__).with_name("guard.py")
LOG_TAIL_LINES = 40
# What vLLM logs when asked to trace without the OpenTelemetry packages (vllm/config/observability.py).
OTEL_MISSING = "OpenTelemetry is not available"
SPANS_OFF_BY_HOST = "the host's operator turned server spans off (TAILTUNE_SERVER_SPANS=0)"
SPANS_OFF_BY_ENGINE = (
    "the engine build has no OpenTelemetry packages, so vLLM cannot trace requests "
    "(it refused --otlp-traces-endpoint; the server was started without it)"
)

# The lines of a dying vLLM that say why: exception lines and vLLM's ERROR records.
_ERROR_LINE = re.compile(
    r"(^[\w.]*(Error|Exception|Exit)\b.*)|(\bERROR\b.*)|(^\s*Value error,.*)|(Traceback)", re.MULTILINE
)


class EngineError(Exception):
    """A run-ending engine outcome. ``outcome`` is the Run status it maps to."""

    outcome = "failed"

    def __init__(self, reason: str, *, log_tail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


class EngineFailed(EngineError):
    """The server died, never became healthy, or could not be reached: the run is ``failed``."""

    outcome = "failed"


class EngineInvalid(EngineError):
    """The server runs with other args than requested: the run is ``invalid``."""

    outcome = "invalid"

    def __init__(self, reason: str, *, facts: ServerFacts, log_tail: str = "") -> None:
        super().__init__(reason, log_tail=log_tail)
        self.facts = facts
        self.mismatches = facts.confirmation.mismatches


@dataclass
class ServerFacts:
    """What a confirmed server is: the Run's provenance fields."""

    effective_args: dict[str, Any]
    vllm_version: str
    image_digest: str
    model_revision: str
    tokenizer_revision: str
    hardware_id: str
    confirmation: Confirmation = field(repr=False, default_factory=Confirmation)

    def run_fields(self) -> dict[str, Any]:
        """Keyword arguments for updating the Run row."""
        return {
            "effective_args": self.effective_args,
            "vllm_version": self.vllm_version,
            "image_digest": self.image_digest,
            "model_revision": self.model_revision,
            "tokenizer_revision": self.tokenizer_revision,
            "hardware_id": self.hardware_id,
        }


def read_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 256 * 1024) -> str:
    """The last ``lines`` lines of a log file (reading at most ``max_bytes`` from its end)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def failure_reason(headline: str, log_text: str) -> str:
    """A headline plus vLLM's own error text from the log (the last traceback's message lines)."""
    lines = log_text.splitlines()
    last_tb = max((i for i, line in enumerate(lines) if "Traceback" in line), default=-1)
    scope = lines[last_tb + 1 :] if last_tb >= 0 else lines
    picked = [line.strip() for line in scope if _ERROR_LINE.search(line) and "Traceback" not in line]
    if not picked:
        picked = [line.strip() for line in lines[-5:] if line.strip()]
    # Keep it readable: the last few distinct error lines, in order.
    seen: list[str] = []
    for line in picked:
        if line not in seen:
            seen.append(line)
    return headline + "\n" + "\n".join(seen[-8:])


def _exit_text(code: int) -> str:
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"was killed by {signal.Signals(code - 128).name} (exit status {code})"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _json_or_none(response: httpx.Response) -> Any:
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


class EngineServer:
    """One vLLM server process tree for one run (see the module docstring for the flow)."""

    def __init__(
        self,
        *,
        model: str,
        cell_args: Mapping[str, Any],
        controls: Mapping[str, Any],
        host: HostConfig,
        log_path: Path,
        health_deadline_s: float = 300.0,
        grace_s: float = 20.0,
        port: int | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        model_path = Path(model)
        if not model_path.is_absolute() and model_path.exists():
            model = str(model_path.resolve())  # the server's cwd is not ours to assume
        self.host = host
        # The worker's span receiver for this server (workers/engine/spans.py), bound now so its
        # endpoint goes on the command line; None when the host turned spans off, or the engine
        # build turned out to have no OpenTelemetry (spans_off_reason says which).
        self.spans: SpanReceiver | None = SpanReceiver() if host.server_spans else None
        self.spans_off_reason = "" if host.server_spans else SPANS_OFF_BY_HOST
        self._launch_args: dict[str, Any] = {
            "model": model,
            "cell_args": cell_args,
            "controls": controls,
            "host": host,
            "base_env": base_env,
        }
        try:
            self.plan: LaunchPlan = build_launch(
                **self._launch_args,
                port=port,
                otlp_traces_endpoint=self.spans.endpoint if self.spans is not None else None,
            )
        except BaseException:
            self._close_spans()
            raise
        self.log_path = Path(log_path)
        self.health_deadline_s = health_deadline_s
        self.grace_s = grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.facts: ServerFacts | None = None
        self._pipe_w: int | None = None
        self._log_fh: Any = None
        self._tracked: dict[int, int] = {}  # pid -> start ticks
        self._stop_lock = threading.Lock()
        self._client = httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0))

    # -- properties ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self.plan.base_url

    @property
    def served_model_name(self) -> str:
        return self.plan.served_model_name

    @property
    def pgid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server and wait until /health answers 200.

        Raises EngineFailed with the log's error text as soon as the process
        exits, or when ``health_deadline_s`` passes (the server is stopped first).
        An engine build without OpenTelemetry refuses ``--otlp-traces-endpoint`` at start-up:
        the server is then started once more without it, and ``spans_off_reason`` says so.
        """
        if self.spans is not None:
            self.spans.start()
        try:
            self._start_process()
        except EngineFailed:
            if self.spans is None or OTEL_MISSING not in read_tail(self.log_path, lines=400):
                raise
            self.stop()  # reaps what the failed start left
            self.proc = None
            self._tracked.clear()
            self._close_spans()
            self.spans_off_reason = SPANS_OFF_BY_ENGINE
            self.plan = build_launch(**self._launch_args, port=self.plan.port)
            self._start_process()

    def _start_process(self) -> None:
        if self.proc is not None:
            raise RuntimeError("already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "ab")  # lives as long as the server
        read_fd, self._pipe_w = os.pipe()
        argv = [sys.executable, str(GUARD), f"--grace={self.grace_s}", "--", *self.plan.argv]
        try:
            self.proc = subprocess.Popen(
                argv,
                env=self.plan.env,
                stdin=read_fd,
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            os.close(read_fd)
        self._track()
        deadline = time.monotonic() + self.health_deadline_s
        while True:
            self._track()
            code = self.proc.poll()
            if code is not None:
                self._raise_failed(f"vLLM {_exit_text(code)} during startup")
            if self._healthy():
                self._track()
                return
            if time.monotonic() > deadline:
                self.stop()
                self._raise_failed(f"vLLM was not healthy within {self.health_deadline_s:g} s")
            time.sleep(0.5)

    def answers_health(self) -> bool:
        """True when the server's /health answers 200 now (False before start or on any error)."""
        return self.proc is not None and self._healthy()

    def _healthy(self) -> bool:
        try:
            return self._client.get(self.base_url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _raise_failed(self, headline: str) -> None:
        log_text = read_tail(self.log_path, lines=200)
        raise EngineFailed(
            failure_reason(headline, log_text), log_tail="\n".join(log_text.splitlines()[-LOG_TAIL_LINES:])
        )

    def _track(self) -> None:
        """Remember every process of the server (group members and descendants).

        Only while the guard is unreaped: after that its pid may belong to a
        stranger, whose descendants must never be taken for ours.
        """
        if self.proc is None or self.proc.poll() is not None:
            return
        all_procs = procs.all_procs()
        for p in procs.group(self.proc.pid, all_procs) + procs.tree(self.proc.pid, all_procs):
            self._tracked.setdefault(p.pid, p.start_ticks)

    def tracked_pids(self) -> list[list[int]]:
        """[[pid, start_ticks], ...] of the server's processes, for reap_pids() after a worker crash."""
        self._track()
        return [[pid, ticks] for pid, ticks in sorted(self._tracked.items())]

    def failure(self) -> str | None:
        """None while the server runs; else the reason it is gone (with vLLM's last error text)."""
        if self.proc is None:
            return "vLLM was never started"
        code = self.proc.poll()
        if code is None:
            return None
        return failure_reason(f"vLLM {_exit_text(code)} during the run", read_tail(self.log_path, lines=200))

    def check_alive(self) -> None:
        """Raise EngineFailed if the server has died."""
        reason = self.failure()
        if reason is not None:
            raise EngineFailed(reason, log_tail=read_tail(self.log_path))

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        pgid = self.proc.pid
        if self.proc.returncode is None:
            # The guard is unreaped (running or a zombie), so its pid, the group id, is still ours.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            return
        # The guard is reaped: its number may be reused, so signal only processes we recorded.
        for pid in procs.alive_pids(self.tracked_pids()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _running(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is None or bool(procs.alive_pids(self.tracked_pids()))

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL after ``grace_s``; returns the exit status.

        Idempotent and safe to call from another thread (e.g. a cancel watcher
        while ``start()`` waits): the second caller waits for the first.
        """
        with self._stop_lock:
            code = None
            if self.proc is not None:
                self._track()
                self._signal_group(signal.SIGTERM)
                deadline = time.monotonic() + self.grace_s
                while time.monotonic() < deadline and self._running():
                    time.sleep(0.1)
                if self._running():
                    self._signal_group(signal.SIGKILL)
                code = self.proc.wait()
                # Anything that left the group (a daemon that called setsid) is still ours.
                procs.reap_pids(self.tracked_pids(), grace_s=min(self.grace_s, 5.0))
            if self._pipe_w is not None:
                os.close(self._pipe_w)
                self._pipe_w = None
            if self._log_fh is not None:
                self._log_fh.close()
                self._log_fh = None
            return code

    def _close_spans(self) -> None:
        spans, self.spans = self.spans, None
        if spans is not None:
            spans.close()

    def close(self) -> None:
        self.stop()
        self._close_spans()
        self._client.close()

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- confirmation -------------------------------------------------------------------------

    def confirm(self) -> ServerFacts:
        """Confirm the effective args and record provenance; raise EngineInvalid on any mismatch."""
        self.check_alive()
        try:
            models_response = self._client.get(self.base_url + "/v1/models")
            metrics_response = self._client.get(self.base_url + "/metrics")
            version_response = self._client.get(self.base_url + "/version")
        except httpx.HTTPError as exc:
            self.check_alive()
            raise EngineFailed(f"vLLM did not answer during confirmation: {exc}") from exc
        # A missing or broken answer is a witness that cannot confirm: compare_effective
        # turns None into a mismatch, so the run ends invalid rather than crashing here.
        models = _json_or_none(models_response)
        metrics_text = metrics_response.text if metrics_response.status_code == 200 else ""
        version_payload = _json_or_none(version_response) or {}
        info = [
            s for s in parse_metrics(metrics_text, names=["vllm:cache_config_info"]) if s["kind"] == "info"
        ]
        cache_config = dict(info[0]["labels"]) if info else None
        conf = compare_effective(
            requested=self.plan.requested,
            model=self.plan.model,
            served_model_name=self.served_model_name,
            non_default_args=parse_non_default_args(
                read_tail(self.log_path, lines=100_000, max_bytes=8 << 20)
            ),
            models_payload=models,
            cache_config=cache_config,
        )
        model_dir = Path(self.plan.model) if Path(self.plan.model).is_dir() else None
        revision = self.plan.requested.get("revision")
        tokenizer_revision = self.plan.requested.get("tokenizer_revision")
        conf.mismatches.update(
            check_revisions(model_dir=model_dir, revision=revision, tokenizer_revision=tokenizer_revision)
        )
        recorded = read_revisions(model_dir) if model_dir else None
        version = str(version_payload.get("version", ""))
        image_digest = self.host.image_digest
        if not image_digest:
            local = local_install_digest(self.host.vllm_command[0])
            if local is not None:
                version = version or local[0]
                image_digest = local[1]
        self.facts = ServerFacts(
            effective_args=conf.record(),
            vllm_version=version,
            image_digest=image_digest,
            model_revision=str(revision or (recorded or {}).get("model_revision", "")),
            tokenizer_revision=str(tokenizer_revision or (recorded or {}).get("tokenizer_revision", "")),
            hardware_id=hardware_id(devices=self.host.devices),
            confirmation=conf,
        )
        if not conf.ok:
            raise EngineInvalid(conf.reason, facts=self.facts, log_tail=read_tail(self.log_path))
        return self.facts

    # -- warm-up ------------------------------------------------------------------------------

    def warm_up(self, *, n: int = 4, prompt_tokens: int = 16, max_tokens: int = 8) -> int:
        """Send ``n`` small completions one after another (not measured); returns how many succeeded.

        Raises EngineFailed if the server dies meanwhile.
        """
        ok = 0
        prompt = [5 + (i % 100) for i in range(prompt_tokens)]
        for _ in range(n):
            try:
                response = self._client.post(
                    self.base_url + "/v1/completions",
                    json={
                        "model": self.served_model_name,
                        "prompt": prompt,
                        "max_tokens": max_tokens,
                        "temperature": 0.0,
                        "ignore_eos": True,
                    },
                    timeout=120.0,
                )
                ok += response.status_code == 200
            except httpx.HTTPError:
                self.check_alive()
        self.check_alive()
        return ok
