"""Two test lanes on a two-core machine: each lane owns one core, and a test that needs both waits.

``make test`` runs pytest-xdist with one worker per lane (``-n 2 --dist load
--maxschedchunk 2``) on a machine with two cores or more; ``LANES=0`` runs one
lane. Two engine tests side by side finish sooner than one after the other,
though each runs slower on one core (measured 1.4-2x); what they claim must
still hold, so:

1. **Each lane owns one core.** An xdist worker pins itself to its own core
   at start (``sched_setaffinity``); every process a test starts inherits the
   mask: the pipeline's worker, the vLLM server, the replay. vLLM's CPU
   engine binds its OpenMP threads within that mask (``auto`` reads the
   process's affinity), so two servers never share a core.
2. **A test that needs the whole machine says so** with
   ``@pytest.mark.whole_machine(reason=...)``. It takes the machine lock
   exclusively, every other test takes it shared, and the test's process gets
   every core back for its duration. The lock lets a waiting exclusive taker
   in first (a turnstile), so the other lane cannot starve it.
3. **No lane idles.** The collection keeps pytest-django's rule that the
   tests rolled back in a transaction come before the ones that flush the
   database (each lane has its own database). Then come the whole-machine
   tests, one lane running each while the other waits on the lock; then the
   engine tests by the durations they took in CI (``WEIGHTS_S``, longest
   first); then every other test, the short ones that even out the lanes' ends.
   A whole-machine test so waits only for another whole-machine test, or for
   the other lane's current rolled-back test. (Run last, as they once were,
   the first of them waited for the other lane's last long engine test: 258 s
   in a clean-clone run, one core idle.)

Without xdist (one lane: ``pytest tests/x.py`` by hand, or a one-core
machine) none of this applies: nothing is pinned, locked or reordered.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# Seconds each engine test that shares the machine took in a clean-clone CI run on this machine in
# two lanes (465bb91, `--durations=0`, on one core each); only their order matters. An engine
# test not listed counts as DEFAULT_ENGINE_S. (The whole-machine tests go before them all.)
WEIGHTS_S = {
    # Not from CI: its calibration alone took 6 minutes by hand in one lane (tests/orchestration/
    # test_reference_sweep_engine.py); the longest engine test, so it starts first.
    "test_the_scaled_down_reference_sweep_reaches_a_decision_with_every_check": 900,
    "test_it_runs_the_whole_journey_in_the_browser": 178,
    "test_it_survives_a_worker_killed_mid_run": 152,
    # In a clean-clone CI run at c23f97d (tests/orchestration/test_search_e2e.py).
    "test_a_small_search_screens_on_the_engine_goes_on_past_a_refused_config_and_confirms_one": 144,
    "test_it_runs_two_cells_confirms_them_observes_preemption_and_detects_a_kill": 110,
    # In its lane, CI at c23f97d (66 s with the whole machine before).
    "test_it_probes_b0_freezes_the_rates_and_runs_a_scenario_through_the_pipeline": 63,
    "test_one_server_per_cell_and_round_with_idle_checks_and_a_busy_server_makes_the_next_run_invalid": 107,
    "test_it_runs_a_small_experiment_end_to_end_and_ignores_a_redelivered_task": 91,
    "test_create_start_wait_report_approve_and_fetch_the_manifest_through_the_api": 90,
    "test_the_sampling_settings_reach_the_server_and_a_cell_sent_with_others_is_invalid": 72,
    "test_runs_made_invalid_on_purpose_are_inconclusive": 50,
    "test_it_cancels_mid_run_within_ten_seconds_keeping_partial_records": 42,
    "test_it_replays_a_trace_with_exact_token_counts": 35,
}
DEFAULT_ENGINE_S = 20


def lane() -> tuple[int, int] | None:
    """(this lane's index, the number of lanes) in an xdist worker of a run with two or more."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return None
    return int(worker[2:]), count


_ALL_CPUS: set[int] = set()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "whole_machine(reason): needs every core; no other test runs beside it (tests/lanes.py)"
    )
    here = lane()
    if here is None:
        return
    index, count = here
    _ALL_CPUS.update(os.sched_getaffinity(0))
    cpus = sorted(_ALL_CPUS)
    if len(cpus) < count:
        raise pytest.UsageError(f"{count} test lanes need {count} cores; this process may use {cpus}")
    per_lane = len(cpus) // count
    os.sched_setaffinity(0, cpus[index * per_lane : (index + 1) * per_lane])


def _rolls_back(item: pytest.Item) -> bool:
    """A database test in a transaction that is rolled back (pytest-django runs these first: a
    transactional test flushes the database, and the rows the migrations made go with it)."""
    fixtures = getattr(item, "fixturenames", [])
    marker = item.get_closest_marker("django_db")
    if marker is None and "db" not in fixtures:
        return False
    if marker is not None and (marker.kwargs.get("transaction") or marker.kwargs.get("reset_sequences")):
        return False
    return "transactional_db" not in fixtures and "live_server" not in fixtures


def _order(item: pytest.Item) -> tuple[int, float]:
    if _rolls_back(item):
        return 0, 0.0
    if item.get_closest_marker("whole_machine") is not None:
        return 1, 0.0  # see the module docstring, step 3
    name = getattr(item, "originalname", None) or item.name
    weight = WEIGHTS_S.get(name, DEFAULT_ENGINE_S) if item.get_closest_marker("engine") else 0
    return 2, -float(weight)


@pytest.hookimpl(trylast=True)  # after pytest-django's own order, which it keeps
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if lane() is None:
        return
    # A stable sort: tests of equal weight (the unit tests) keep their collection order.
    items.sort(key=_order)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load scheduler, but a lane never holds more than the test it runs and the next.

    xdist's own refills a lane by two tests per finished one until it holds about an eighth of
    what is left, whatever ``--maxschedchunk`` says: in a clean-clone run one lane so reached
    the whole-machine tests while the other still held six engine tests, which then waited on
    the lock (cancel: 291 s). Two is the least a worker takes (it must know its next test).
    """
    if (config.getoption("numprocesses", None) or 0) < 2:
        return None
    from xdist.scheduler import LoadScheduling

    class OneAhead(LoadScheduling):  # type: ignore[misc]
        def check_schedule(self, node: Any, duration: float = 0) -> None:
            if node.shutting_down:
                return
            if not self.pending:
                node.shutdown()
                return
            short = 2 - len(self.node2pending[node])
            if short > 0:
                self._send_tests(node, min(short, len(self.pending)))

    return OneAhead(config, log)


@contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_paths() -> tuple[Path, Path]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "local")
    base = Path(tempfile.gettempdir())
    return base / f"tailtune-lanes-{run}.turnstile", base / f"tailtune-lanes-{run}.machine"


@pytest.fixture(autouse=True)
def _lane_lock(request: pytest.FixtureRequest) -> Iterator[None]:
    """Shared hold on the machine for an ordinary test, the whole of it for a whole_machine one."""
    here = lane()
    if here is None:
        yield
        return
    turnstile, machine = _lock_paths()
    if request.node.get_closest_marker("whole_machine") is None:
        with _locked(turnstile, fcntl.LOCK_EX):
            pass  # wait here while an exclusive taker is queued or running
        with _locked(machine, fcntl.LOCK_SH):
            yield
        return
    mine = os.sched_getaffinity(0)
    with _locked(turnstile, fcntl.LOCK_EX), _locked(machine, fcntl.LOCK_EX):
        os.sched_setaffinity(0, _ALL_CPUS)
        try:
            yield
        finally:
            os.sched_setaffinity(0, mine)
