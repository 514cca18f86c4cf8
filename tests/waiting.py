"""The one way a test waits for something to happen: ``wait_for``.

A test that waits for another process, thread or server polls a predicate
until it holds, and fails with what it awaited when the timeout passes first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.5,
    *,
    what: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``predicate`` every ``interval_s`` until it returns something truthy, and return that.

    After ``timeout_s`` an ``AssertionError`` says ``what`` was not met: a string, or a callable
    read only then (a log's tail, a state).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    said = what() if callable(what) else what
    raise AssertionError(f"{said}: not met within {timeout_s} s")
