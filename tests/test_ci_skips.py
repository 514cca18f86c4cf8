"""A skip in CI fails the run unless a marker allows it (tests/ci_skips.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import pytest

def test_skips():
    pytest.skip("the engine is not built")

@pytest.mark.allow_skip(reason="optional tool, not a claim")
def test_may_skip():
    pytest.skip("docker-compose is missing")

def test_passes():
    pass
"""


def _run(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DJANGO_SETTINGS_MODULE")}
    env["PYTHONPATH"] = str(REPO)
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "tests.ci_skips", "-p", "no:django",
         "-p", "no:cacheprovider", "test_probe.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_skip_fails_in_ci_unless_a_marker_allows_it(tmp_path):
    done = _run(tmp_path, ci=True)
    assert done.returncode == 1, done.stdout
    assert (
        "skipped in CI, and no allow_skip marker allows it: Skipped: the engine is not built" in done.stdout
    )
    assert "1 failed, 1 passed, 1 skipped" in done.stdout


def test_a_skip_outside_ci_stays_a_skip(tmp_path):
    done = _run(tmp_path, ci=False)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 2 skipped" in done.stdout
