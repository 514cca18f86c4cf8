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


@pytest.fixture(scope="session", autouse=True)
def model_roots_with_temp_dirs(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Tests build small models under pytest's temporary directory: it is a model root here
    (TAILTUNE_MODEL_ROOTS) beside the defaults, in this process and the workers it starts."""
    import json
    import os

    from django.conf import settings

    before, env_before = list(settings.TAILTUNE_MODEL_ROOTS), os.environ.get("TAILTUNE_MODEL_ROOTS")
    roots = [*before, str(tmp_path_factory.getbasetemp().resolve())]
    settings.TAILTUNE_MODEL_ROOTS = roots
    os.environ["TAILTUNE_MODEL_ROOTS"] = json.dumps(roots)
    yield
    settings.TAILTUNE_MODEL_ROOTS = before
    if env_before is None:
        os.environ.pop("TAILTUNE_MODEL_ROOTS", None)
    else:
        os.environ["TAILTUNE_MODEL_ROOTS"] = env_before
