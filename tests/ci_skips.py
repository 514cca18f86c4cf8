"""In CI, a test that skips or is expected to fail fails the run unless a marker says why that is fine.

A claim that can quietly end in a skip proves nothing: an engine test skipped because
the engine was not built, or a browser test because Chromium is missing, would leave
CI green with its claim untested; so would an ``xfail`` that hides a failure. Under
``CI`` (set by ``.ci/run``) each of these fails the run, keeping its own words, unless
a marker names it:

- a test that skips (``pytest.skip``, a ``skipif``/``skip`` mark, its own or its
  module's ``pytestmark``, a fixture that skips): its report turns into a failure,
  unless the test is marked ``@pytest.mark.allow_skip(reason="...")``;
- a test expected to fail (an ``xfail`` mark or ``pytest.xfail()``), whether it then
  fails (XFAIL) or passes (XPASS): a failure, unless it is marked
  ``@pytest.mark.allow_xfail(reason="...")``;
- a module that skips while it is being collected (``pytest.skip(...,
  allow_module_level=True)``, a module-level ``pytest.importorskip``): its tests were
  never collected, so its collection report turns into a collection error, unless
  the module's own ``pytestmark`` carries ``pytest.mark.allow_skip(reason="...")``.
  That module never finished importing, so the marker is read from its source.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_skip(reason): this test may skip in CI, for the reason given")
    config.addinivalue_line(
        "markers", "allow_xfail(reason): this test may be expected to fail in CI, for the reason given"
    )


def _why(longrepr: object) -> str:
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not os.environ.get("CI"):
        return
    if hasattr(report, "wasxfail"):
        if report.failed or item.get_closest_marker("allow_xfail") is not None:
            return  # a strict xfail that passed has failed already
        verdict = "xfailed" if report.skipped else "xpassed"
        why = report.wasxfail or "no reason given"
        del report.wasxfail
        report.outcome = "failed"
        report.longrepr = f"{verdict} in CI, and no allow_xfail marker allows it: {why}"
        return
    if not report.skipped or item.get_closest_marker("allow_skip") is not None:
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, and no allow_skip marker allows it: {_why(report.longrepr)}"


def module_allows_skip(path: Path) -> bool:
    """Whether the module at ``path`` assigns a ``pytestmark`` holding ``pytest.mark.allow_skip(reason=...)``
    with a reason, read from its source (a module skipped while it was imported has no object)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        for call in ast.walk(value):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "allow_skip"
                and any(
                    k.arg == "reason" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in call.keywords
                )
            ):
                return True
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or not os.environ.get("CI"):
        return
    if isinstance(collector, pytest.Module) and module_allows_skip(collector.path):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{collector.nodeid} skipped while being collected in CI, and no allow_skip marker in its "
        f"pytestmark allows it: {_why(report.longrepr)}"
    )
