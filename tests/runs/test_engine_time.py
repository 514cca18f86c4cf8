"""Engine-time accounting (apps/runs/engine_time.py): parts, the plan, savings, hosts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from apps.runs.engine_time import engine_time_account

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def row(
    status: str, host: str, cell: str, repeat: int, parts: dict[str, float] | None, at: int
) -> dict[str, Any]:
    return {
        "status": status,
        "host": host,
        "cell": cell,
        "repeat": repeat,
        "kind": "sweep",
        "windows_s": 10.0,
        "drain_deadline_s": 20.0,
        "planned_s": 30.0,
        "engine_time": parts,
        "started_at": T0 + timedelta(seconds=at) if parts else None,
        "finished_at": T0 + timedelta(seconds=at + 40) if parts else None,
    }


def test_it_splits_what_was_spent_and_says_what_reuse_early_stopping_and_drains_saved() -> None:
    new = {"start_s": 50.0, "warmup_s": 4.0, "windows_s": 10.0, "drain_s": 2.0, "stop_s": 6.0}
    reused = {"idle_check_s": 1.0, "windows_s": 10.0, "drain_s": 4.0}
    rows = [
        row("done", "a", "B0", 1, new, 0),
        row("done", "a", "B0", 1, reused, 60),
        row("done", "b", "C1", 1, new, 0),
        row("skipped", "", "C1", 1, None, 0),  # the rest of C1's round: its server was up
        row("skipped", "", "C1", 2, None, 0),  # all of C1's second round: never started
        row("skipped", "", "C1", 2, None, 0),
    ]
    account = engine_time_account(rows, default_start_s=60.0)
    assert account is not None
    assert account["spent_parts_s"] == {
        "start": 100.0, "warmup": 8.0, "idle_check": 1.0, "windows": 30.0, "drain": 8.0, "stop": 12.0,
    }  # fmt: skip
    assert account["spent_s"] == 159.0 and account["server_starts"] == 2 and account["runs_reused"] == 1
    assert account["mean_start_s"] == 60.0  # start + warm-up + stop of the servers that started
    assert account["planned_s"] == 6 * (30.0 + 60.0)
    assert account["saved_s"] == {
        "reuse": 60.0 - 1.0,
        "early_stop": 3 * (10.0 + 8.0 / 3) + 1 * 60.0,  # windows + mean drain each, one start never made
        "drain": (20 - 2) + (20 - 4) + (20 - 2),
    }
    assert account["span_s"] == 100.0
    assert account["hosts"] == [
        {"host": "a", "busy_s": 72.0 + 15.0, "idle_s": 13.0},
        {"host": "b", "busy_s": 72.0, "idle_s": 28.0},
    ]
    assert account["ratio_planned_to_spent"] == pytest.approx(540 / 159, abs=0.01)


def test_nothing_is_accounted_before_a_run_records_its_engine_time() -> None:
    assert engine_time_account([row("queued", "", "B0", 1, None, 0)], default_start_s=60.0) is None
