"""The send-loop process's scheduling class (workers/replay/runtime.realtime_send_loop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.replay import runtime

REPO = Path(__file__).resolve().parents[2]

# Asks for the class, then reports what the kernel says of this thread and of a thread started
# after it (a child process: the pytest process itself must stay in the normal class).
CHILD = """
import json, os, threading
from workers.replay.runtime import realtime_send_loop
said = realtime_send_loop()
seen = {}
def look():
    seen["thread"] = os.sched_getscheduler(0)
t = threading.Thread(target=look)
t.start(); t.join()
print(json.dumps({"said": said, "main": os.sched_getscheduler(0), "thread": seen["thread"]}))
"""

# Whether this host lets an unprivileged call take SCHED_FIFO, asked of the kernel directly.
PERMITTED = """
import os
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print("yes")
except OSError:
    print("no")
"""


def _python(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_the_process_and_the_threads_it_starts_get_the_class_it_reports() -> None:
    permitted = _python(PERMITTED) == "yes"
    got = json.loads(_python(CHILD))
    if permitted:
        assert got == {"said": "realtime", "main": os.SCHED_FIFO, "thread": os.SCHED_FIFO}
    else:
        assert got["said"].startswith("normal (real-time scheduling refused: ")
        assert got["main"] == got["thread"] == os.SCHED_OTHER


def test_it_stays_normal_when_turned_off() -> None:
    got = json.loads(_python(CHILD, **{runtime.REALTIME_ENV: "0"}))
    assert got == {
        "said": "normal (TAILTUNE_REPLAY_REALTIME=0)",
        "main": os.SCHED_OTHER,
        "thread": os.SCHED_OTHER,
    }


def test_a_refusal_is_reported_with_the_kernels_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.delenv(runtime.REALTIME_ENV, raising=False)
    monkeypatch.setattr(runtime.os, "sched_setscheduler", refuse)
    assert runtime.realtime_send_loop() == "normal (real-time scheduling refused: Operation not permitted)"
