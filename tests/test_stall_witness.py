"""The stall witness (tests/stall_witness.py) sees a process the host does not run."""

from __future__ import annotations

import os
import signal
import time

from tests.stall_witness import StallWitness


def test_it_confirms_a_stall_only_when_its_heartbeat_was_held_back(tmp_path):
    with StallWitness(tmp_path) as held:
        # What a throttled host does to every process: its heartbeat is not run for 0.3 s.
        os.kill(held._proc.pid, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(held._proc.pid, signal.SIGCONT)
        time.sleep(0.1)
    assert held.confirms(250), held.facts
    assert set(held.facts) == {"heartbeat_max_oversleep_ms", "cpu_pressure_some_ms", "steal_ms"}
    with StallWitness(tmp_path) as idle:
        time.sleep(0.1)
    assert not idle.confirms(250), idle.facts
