"""In CI, a skipped test fails the run unless a marker says why that skip is allowed.

A claim that can quietly end in a skip proves nothing: an engine test skipped because
the engine was not built, or a browser test because Chromium is missing, would leave
CI green with its claim untested. Under ``CI`` (set by ``.ci/run``) every skip is
turned into a failure that keeps the skip's own words, except for a test marked
``@pytest.mark.allow_skip(reason="...")``, whose reason names why skipping it is fine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_skip(reason): this test may skip in CI, for the reason given")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or hasattr(report, "wasxfail") or not os.environ.get("CI"):
        return
    if item.get_closest_marker("allow_skip") is not None:
        return
    longrepr = report.longrepr
    why = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, and no allow_skip marker allows it: {why}"
