"""In CI, a skip or an xfail fails the run unless a marker allows it (tests/ci_skips.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Tests that skip or are expected to fail while they run.
IN_TESTS = """
import pytest

def test_skips():
    pytest.skip("the engine is not built")

@pytest.mark.allow_skip(reason="optional tool, not a claim")
def test_may_skip():
    pytest.skip("docker-compose is missing")

@pytest.mark.xfail(reason="known bug 12")
def test_xfails():
    assert False

@pytest.mark.xfail(reason="known bug 13")
def test_xpasses():
    pass

def test_xfail_call():
    pytest.xfail("flaky on this host")

@pytest.mark.allow_xfail(reason="documents an engine limit")
@pytest.mark.xfail(reason="the engine refuses it")
def test_may_xfail():
    assert False

def test_passes():
    pass
"""
# A whole module skipped by its pytestmark: each of its tests skips in its setup.
MARKED_MODULE = """
import pytest

pytestmark = pytest.mark.skipif(True, reason="Chromium is missing")

def test_in_a_skipped_module():
    pass
"""
# Modules that skip while they are imported: their tests are never collected.
SKIPPED_MODULE = """
import pytest

pytest.skip("no engine on this machine", allow_module_level=True)

def test_never_collected():
    pass
"""
ALLOWED_SKIPPED_MODULE = """
import pytest

pytestmark = pytest.mark.allow_skip(reason="an optional extra")
extra = pytest.importorskip("not_a_module_anywhere")

def test_never_collected():
    pass
"""


def _run(tmp_path: Path, ci: bool, modules: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name, text in modules.items():
        (tmp_path / f"test_{name}.py").write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DJANGO_SETTINGS_MODULE")}
    env["PYTHONPATH"] = str(REPO)
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "tests.ci_skips", "-p", "no:django",
         "-p", "no:cacheprovider", *sorted(f"test_{name}.py" for name in modules)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _summary(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


def test_a_skip_or_an_xfail_in_a_test_fails_in_ci_unless_a_marker_allows_it(tmp_path):
    done = _run(tmp_path, ci=True, modules={"in_tests": IN_TESTS, "marked_module": MARKED_MODULE})
    out = done.stdout
    assert done.returncode == 1, out
    refused = "in CI, and no allow_skip marker allows it"
    assert f"FAILED test_in_tests.py::test_skips - skipped {refused}: Skipped: the engine is not built" in out
    # A skipif in the module's pytestmark skips in each test's setup: refused there (an error).
    assert (
        f"ERROR test_marked_module.py::test_in_a_skipped_module - skipped {refused}: "
        "Skipped: Chromium is missing" in out
    )
    xfail = "in CI, and no allow_xfail marker allows it"
    assert f"FAILED test_in_tests.py::test_xfails - xfailed {xfail}: known bug 12" in out
    assert f"FAILED test_in_tests.py::test_xpasses - xpassed {xfail}: known bug 13" in out
    assert f"FAILED test_in_tests.py::test_xfail_call - xfailed {xfail}: flaky on this host" in out
    # What a marker allows stays what pytest made of it.
    assert "SKIPPED [1] test_in_tests.py:9: docker-compose is missing" in out
    assert "XFAIL test_in_tests.py::test_may_xfail - the engine refuses it" in out
    assert re.search(r"4 failed, 1 passed, 1 skipped, 1 xfailed, 1 error in ", _summary(out)), out


def test_a_module_skipped_while_collected_fails_in_ci_unless_its_pytestmark_allows_it(tmp_path):
    done = _run(tmp_path, ci=True, modules={"skipped": SKIPPED_MODULE, "allowed": ALLOWED_SKIPPED_MODULE})
    out = done.stdout
    # A collection error: pytest stops before running anything.
    assert done.returncode == 2, out
    assert (
        "ERROR test_skipped.py - test_skipped.py skipped while being collected in CI, and no "
        "allow_skip marker in its pytestmark allows it: Skipped: no engine on this machine" in out
    )
    assert "SKIPPED [1] test_allowed.py:5: could not import 'not_a_module_anywhere'" in out
    assert re.search(r"1 skipped, 1 error in ", _summary(out)), out


def test_outside_ci_a_skip_stays_a_skip_and_an_xfail_an_xfail(tmp_path):
    modules = {
        "in_tests": IN_TESTS,
        "marked_module": MARKED_MODULE,
        "skipped": SKIPPED_MODULE,
        "allowed": ALLOWED_SKIPPED_MODULE,
    }
    done = _run(tmp_path, ci=False, modules=modules)
    assert done.returncode == 0, done.stdout
    assert re.search(r"1 passed, 5 skipped, 3 xfailed, 1 xpassed in ", _summary(done.stdout)), done.stdout
