from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.db import connection

from config.env import ImproperEnv, envbool, envint, envlist


@pytest.mark.django_db
def test_it_runs_on_postgres_in_ci() -> None:
    if os.environ.get("CI") or os.environ.get("DATABASE_URL", "").startswith("postgres"):
        assert connection.vendor == "postgresql"
        with connection.cursor() as cur:
            cur.execute("select version()")
            assert cur.fetchone()[0].startswith("PostgreSQL")
    else:
        assert connection.vendor == "sqlite"


def test_it_uses_redis_in_ci() -> None:
    if os.environ.get("CI"):
        assert settings.CELERY_BROKER_URL.startswith("redis://")


def test_it_fails_loudly_on_bad_env_values(monkeypatch) -> None:
    monkeypatch.setenv("X_BOOL", "maybe")
    monkeypatch.setenv("X_INT", "12a")
    with pytest.raises(ImproperEnv, match="X_BOOL"):
        envbool("X_BOOL", False)
    with pytest.raises(ImproperEnv, match="X_INT"):
        envint("X_INT", 1)
    monkeypatch.setenv("X_BOOL", "Yes")
    monkeypatch.setenv("X_LIST", "a, b,,c")
    assert envbool("X_BOOL", False) is True
    assert envlist("X_LIST", []) == ["a", "b", "c"]


def test_it_keeps_the_visibility_timeout_above_the_hard_limit() -> None:
    assert settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] > settings.CELERY_TASK_TIME_LIMIT
    assert settings.CELERY_TASK_ACKS_LATE and settings.CELERY_TASK_REJECT_ON_WORKER_LOST
    assert settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1
    assert settings.CELERY_ACCEPT_CONTENT == ["json"]


def test_it_ships_a_compose_file_with_a_gpu_worker() -> None:
    import shutil
    import subprocess

    import yaml

    compose_cli = shutil.which("docker-compose")
    if compose_cli is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    check = subprocess.run(
        [compose_cli, "-f", str(settings.BASE_DIR / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "SECRET_KEY": "compose-check"},
        timeout=60,
    )
    assert check.returncode == 0, check.stderr

    compose = yaml.safe_load((settings.BASE_DIR / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker-gpu-a"} <= set(services)
    devices = services["worker-gpu-a"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
