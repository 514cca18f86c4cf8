from __future__ import annotations

from pathlib import Path

import pytest

# Users in each role and small experiments (fixtures shared by tests/ui and tests/approvals).
# In CI, a skip fails unless a marker allows it (tests/ci_skips.py).
# Under `make test`, two lanes of one core each (tests/lanes.py).
pytest_plugins = ["tests.role_fixtures", "tests.ci_skips", "tests.lanes"]

REPO = Path(__file__).resolve().parent.parent
SEED_SPEC = REPO / "examples" / "seed-sweep.yaml"


@pytest.fixture
def seed_spec_text() -> str:
    return SEED_SPEC.read_text()


@pytest.fixture
def admin_user(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_superuser("admin", password="pw-admin-123")
