"""Start/stop/death/orphan behaviour of EngineServer, with a fake server standing in for vLLM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.waiting import wait_for
from workers.engine import procs
from workers.engine.launcher import HostConfig
from workers.engine.server import (
    SPANS_OFF_BY_ENGINE,
    SPANS_OFF_BY_HOST,
    EngineFailed,
    EngineInvalid,
    EngineServer,
)
from workers.replay.request import server_request_id, server_run_key

FAKE = Path(__file__).with_name("fake_server.py")
REPO = Path(__file__).resolve().parents[2]


CONTROLS = {"max_model_len": 1024, "kv_cache_memory_bytes": 1048576, "enable_prefix_caching": False}


def fake_server(tmp_path: Path, mode: str = "ok", **kw) -> EngineServer:
    # The fake server exports its spans with opentelemetry-proto, from this interpreter's path.
    env = {"FAKE_SERVER_MODE": mode, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    host = HostConfig(vllm_command=(sys.executable, str(FAKE)), extra_env=env)
    return EngineServer(
        model="/models/fake",
        cell_args={"max_num_seqs": 4, "max_num_batched_tokens": 512},
        controls=CONTROLS,
        host=host,
        log_path=tmp_path / "server.log",
        **{"health_deadline_s": 20, "grace_s": 5, **kw},
    )


def wait_gone(pids: list[int], timeout_s: float = 20.0) -> None:
    wait_for(
        lambda: not procs.alive_pids(pids),
        timeout_s,
        interval_s=0.1,
        what=lambda: f"processes gone (still alive: {procs.alive_pids(pids)})",
    )


def test_it_starts_tracks_and_stops_the_whole_process_tree(tmp_path):
    server = fake_server(tmp_path)
    with server:
        server.start()
        pids = server.tracked_pids()
        # guard, fake server, its child
        assert len(procs.alive_pids(pids)) == 3
        assert all(p.pgid == server.pgid for p in procs.group(server.pgid))
        assert server.failure() is None
    assert procs.alive_pids(pids) == []
    assert procs.group(server.pgid) == []
    assert "fake server pid" in (tmp_path / "server.log").read_text()


def test_it_confirms_a_server_and_records_its_provenance(tmp_path):
    with fake_server(tmp_path) as server:
        server.start()
        facts = server.confirm()
    assert facts.effective_args["max_num_seqs"] == 4
    assert facts.effective_args["max_model_len"] == 1024
    assert facts.effective_args["num_gpu_blocks"] == "8"
    assert facts.vllm_version == "0.0.0-fake"
    fields = facts.run_fields()
    assert set(fields) == {
        "effective_args",
        "vllm_version",
        "image_digest",
        "model_revision",
        "tokenizer_revision",
        "hardware_id",
    }
    assert fields["hardware_id"]


def test_it_makes_the_run_invalid_when_the_server_runs_other_args(tmp_path):
    with fake_server(tmp_path, "liar") as server:
        server.start()
        with pytest.raises(EngineInvalid) as info:
            server.confirm()
    assert info.value.outcome == "invalid"
    assert set(info.value.mismatches) == {"max_num_seqs"}
    assert "max_num_seqs (requested 4, non-default args says 5)" in info.value.reason
    assert info.value.facts.effective_args["max_num_seqs"] == 5


def test_it_fails_fast_with_the_servers_error_text(tmp_path):
    server = fake_server(tmp_path, "die", health_deadline_s=120)
    started = time.monotonic()
    with server, pytest.raises(EngineFailed) as info:
        server.start()
    assert time.monotonic() - started < 60
    assert "exited with status 1 during startup" in info.value.reason
    assert "ValueError: fake engine refuses max_num_seqs (0)" in info.value.reason
    assert info.value.outcome == "failed"
    assert procs.alive_pids(server.tracked_pids()) == []


def test_it_gives_up_at_the_health_deadline_and_leaves_nothing(tmp_path):
    server = fake_server(tmp_path, "hang", health_deadline_s=2)
    with server, pytest.raises(EngineFailed, match="not healthy within 2 s"):
        server.start()
    assert procs.alive_pids(server.tracked_pids()) == []


def test_it_kills_a_server_that_ignores_sigterm(tmp_path):
    server = fake_server(tmp_path, "stubborn", grace_s=1)
    with server:
        server.start()
        pids = server.tracked_pids()
    assert procs.alive_pids(pids) == []


def test_it_detects_a_server_that_dies_mid_run(tmp_path):
    server = fake_server(tmp_path)
    with server:
        server.start()
        main = next(p for p in procs.tree(server.pgid) if p.ppid == server.pgid)
        os.kill(main.pid, signal.SIGKILL)
        wait_for(server.failure, 20, interval_s=0.1, what="the killed server noticed")
        with pytest.raises(EngineFailed, match="killed by SIGKILL"):
            server.check_alive()
        # The guard took the orphaned child down with it.
        wait_gone(server.tracked_pids())


WORKER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from workers.engine.launcher import HostConfig
from workers.engine.server import EngineServer
host = HostConfig(vllm_command=(sys.executable, {fake!r}), extra_env={{"FAKE_SERVER_MODE": "ok"}})
server = EngineServer(model="/models/fake", cell_args={{}}, controls={{}}, host=host,
                      log_path=Path({log!r}), grace_s=3)
server.start()
print(json.dumps(server.tracked_pids()), flush=True)
time.sleep(600)
"""


def test_it_leaves_no_process_behind_when_the_worker_is_killed(tmp_path):
    script = WORKER.format(repo=str(REPO), fake=str(FAKE), log=str(tmp_path / "server.log"))
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(worker.stdout.readline())
        assert len(procs.alive_pids(pids)) == 3
        worker.kill()  # SIGKILL: no cleanup code of the worker runs
        worker.wait()
        wait_gone(pids)
    finally:
        worker.kill()
        worker.wait()


def test_it_reaps_recorded_pids_but_not_a_reused_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        info = procs.proc_info(proc.pid)
        assert procs.reap_pids([[proc.pid, info.start_ticks + 1]], grace_s=1) == []
        assert proc.poll() is None
        assert procs.reap_pids([[proc.pid, info.start_ticks]], grace_s=5) == [proc.pid]
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_it_can_be_stopped_from_another_thread_while_starting(tmp_path):
    server = fake_server(tmp_path, "hang", health_deadline_s=120)
    stopper = threading.Timer(1.0, server.stop)
    stopper.start()
    started = time.monotonic()
    with server, pytest.raises(EngineFailed, match="during startup"):
        server.start()
    stopper.join()
    assert time.monotonic() - started < 60
    assert procs.alive_pids(server.tracked_pids()) == []


def test_a_server_traces_each_request_to_its_own_receiver_and_no_other(tmp_path):
    with fake_server(tmp_path) as server:
        assert server.spans is not None
        endpoint = server.spans.endpoint
        assert (
            endpoint.startswith("http://127.0.0.1:")
            and f"--otlp-traces-endpoint={endpoint}" in server.plan.argv
        )
        server.start()
        server.confirm()  # the launcher's own flag is no mismatch
        answer = httpx.post(
            server.base_url + "/v1/completions",
            json={"model": "/models/fake", "prompt": [1, 2, 3], "max_tokens": 3, "stream": True},
            headers={"X-Request-Id": server_request_id("run-a", 4)},
            timeout=10,
        )
        assert answer.status_code == 200
        store = server.spans.store
        wait_for(lambda: store.count(server_run_key("run-a")) == 1, 10, interval_s=0.05, what="the span")
        [span] = store.take(server_run_key("run-a")).values()
        assert span.request_id == f"cmpl-{server_request_id('run-a', 4)}-0" and span.completion_tokens == 3
    assert server.spans is None  # closed with the server
    with pytest.raises(httpx.ConnectError):
        httpx.post(endpoint, content=b"", headers={"Content-Type": "application/x-protobuf"}, timeout=2)


def test_an_engine_build_without_opentelemetry_is_started_again_without_tracing(tmp_path):
    with fake_server(tmp_path, "no-otel") as server:
        server.start()
        assert server.spans is None and server.spans_off_reason == SPANS_OFF_BY_ENGINE
        assert not any(a.startswith("--otlp-traces-endpoint") for a in server.plan.argv)
        assert server.failure() is None
        server.confirm()
    log = (tmp_path / "server.log").read_text()
    assert log.count("OpenTelemetry is not available") == 1 and log.count("non-default args") == 1


def test_a_host_that_turned_spans_off_starts_its_server_untraced(tmp_path):
    server = EngineServer(
        model="/models/fake",
        cell_args={"max_num_seqs": 4},
        controls=CONTROLS,
        host=HostConfig(vllm_command=(sys.executable, str(FAKE)), server_spans=False),
        log_path=tmp_path / "server.log",
    )
    with server:
        assert server.spans is None and server.spans_off_reason == SPANS_OFF_BY_HOST
        assert not any(a.startswith("--otlp-traces-endpoint") for a in server.plan.argv)
