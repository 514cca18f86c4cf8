"""`manage.py serve` for real (what `make run` runs, on the embedded defaults): killing its worker
leaves the web answering, and the worker is back within seconds, said on the console."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings

from tests.waiting import wait_for
from workers.engine.launcher import free_port


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rpartition(")")[2].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append((int(entry.name), cmdline))
    return out


def _wait(predicate, timeout_s: float, what: str, log: Path):  # type: ignore[no-untyped-def]
    return wait_for(
        predicate, timeout_s, interval_s=0.25, what=lambda: f"{what}; serve said:\n{log.read_text()[-4000:]}"
    )


def _answers(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def test_a_killed_worker_is_restarted_and_the_web_keeps_answering(tmp_path: Path) -> None:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DJANGO_SETTINGS_MODULE")
    }
    env.update(TAILTUNE_DATA=str(tmp_path / "data"), TAILTUNE_HOST="serve-test", SECRET_KEY="serve-test")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--web-workers", "1"],
            cwd=settings.BASE_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/accounts/login/"
    try:
        _wait(lambda: _answers(url) == 200, 180, "the web answered", log)

        def worker() -> int | None:
            return next(
                (pid for pid, cmd in _children(serve.pid) if "celery" in cmd and " worker" in cmd), None
            )

        first = _wait(worker, 60, "the worker started", log)
        os.kill(first, signal.SIGKILL)
        # The web never went down with it.
        assert _answers(url) == 200
        second = _wait(lambda: (w := worker()) is not None and w != first and w, 30, "a new worker", log)
        text = log.read_text()
        assert f"the worker (pid {first}) exited with code -9; restarting it in 1 s" in text, text[-3000:]
        assert f"worker restarted (pid {second}; restart 1)" in text, text[-3000:]
        assert _answers(url) == 200 and serve.poll() is None
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
        # Nothing it started outlives it (the worker's pool included).
        try:
            os.killpg(serve.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
