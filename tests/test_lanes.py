"""Two lanes (tests/lanes.py): one core each, and a whole_machine test runs with nothing beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

# Each test writes when it ran and with which cores. The sleeps only make the tests overlap
# when nothing keeps them apart; no assertion below is about time spent.
PROBE = """
import json, os, time
from pathlib import Path

import pytest

OUT = Path(os.environ["LANES_PROBE_OUT"])


def _record(name):
    start = time.monotonic()
    cores = sorted(os.sched_getaffinity(0))
    time.sleep(0.5)
    (OUT / f"{name}.json").write_text(json.dumps({
        "lane": os.environ.get("PYTEST_XDIST_WORKER"), "cores": cores,
        "start": start, "end": time.monotonic(),
    }))


@pytest.mark.parametrize("n", range(6))
def test_ordinary(n):
    _record(f"ordinary-{n}")


@pytest.mark.whole_machine(reason="probe")
@pytest.mark.parametrize("n", range(2))
def test_whole(n):
    _record(f"whole-{n}")
"""


def _run(tmp_path: Path, *args: str) -> dict[str, dict[str, Any]]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    # Not this run's own lane: the probe is a run of its own, with its own lanes and locks.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CI", "DJANGO_SETTINGS_MODULE") and not k.startswith("PYTEST_XDIST_")
    }
    env.update(PYTHONPATH=str(REPO), LANES_PROBE_OUT=str(out))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.lanes", "-p", "no:django",
         "-p", "no:cacheprovider", *args, "test_probe.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.mark.allow_skip(reason="on one core make test runs one lane, and there is nothing to split")
# Its probe's two lanes need both cores, which this run's own lanes hold otherwise.
@pytest.mark.whole_machine(reason="runs two lanes of its own")
def test_each_lane_owns_a_core_and_a_whole_machine_test_runs_alone(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:  # here, after the whole_machine mark gave every core back
        pytest.skip("two lanes need two cores")
    ran = _run(tmp_path, "-n", "2", "--dist", "load", "--maxschedchunk", "2")
    assert len(ran) == 8
    every = sorted(os.sched_getaffinity(0))
    ordinary = [r for name, r in ran.items() if name.startswith("ordinary")]
    # Each lane ran on one half of the cores, and the halves differ.
    lane_cores = {r["lane"]: tuple(r["cores"]) for r in ordinary}
    assert len(lane_cores) == 2 and len(set(lane_cores.values())) == 2
    for cores in lane_cores.values():
        assert len(cores) == len(every) // 2 and set(cores) <= set(every)
    # A whole-machine test had every core, and ran while no other test did.
    for name, whole in ran.items():
        if not name.startswith("whole"):
            continue
        assert whole["cores"] == every
        for other_name, other in ran.items():
            if other_name != name:
                overlap = min(whole["end"], other["end"]) - max(whole["start"], other["start"])
                assert overlap <= 0, (name, other_name, whole, other)
    # The whole-machine tests ran before the ordinary ones (tests/lanes.py, step 3; the probe has
    # no database tests): each began before the last ordinary test did.
    assert max(r["start"] for n, r in ran.items() if n.startswith("whole")) < max(
        r["start"] for r in ordinary
    )


def test_one_lane_pins_nothing_and_keeps_the_order(tmp_path):
    ran = _run(tmp_path)
    every = sorted(os.sched_getaffinity(0))
    assert {tuple(r["cores"]) for r in ran.values()} == {tuple(every)}
    starts = sorted(ran, key=lambda n: ran[n]["start"])
    assert starts == [f"ordinary-{n}" for n in range(6)] + ["whole-0", "whole-1"]
