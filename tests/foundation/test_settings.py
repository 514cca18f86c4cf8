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


def test_the_broker_accepts_json_only() -> None:
    """Whoever can write to the broker queues ids the database describes, never code: the
    workers' app refuses a pickled message (docs/SECURITY.md, web <-> worker)."""
    from kombu.exceptions import ContentDisallowed
    from kombu.serialization import dumps, loads, prepare_accept_content

    from workers.celery import app

    assert list(app.conf.accept_content) == ["json"]
    assert app.conf.task_serializer == "json" and app.conf.result_serializer == "json"
    accept = prepare_accept_content(app.conf.accept_content)  # as the worker's consumer does
    content_type, encoding, body = dumps({"run": 1}, serializer="pickle")
    with pytest.raises(ContentDisallowed):
        loads(body, content_type, encoding, accept=accept)
    content_type, encoding, body = dumps({"run": 1}, serializer="json")
    assert loads(body, content_type, encoding, accept=accept) == {"run": 1}


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
        env={**os.environ, "SECRET_KEY": "compose-check", "POSTGRES_PASSWORD": "compose-check"},
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    # No password is written in it: without one from the environment (or .env) nothing starts.
    bare = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "POSTGRES_PASSWORD")}
    refused = subprocess.run(
        [compose_cli, "-f", str(settings.BASE_DIR / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        env={**bare, "SECRET_KEY": "compose-check"},
        timeout=60,
    )
    assert refused.returncode != 0 and "set POSTGRES_PASSWORD" in refused.stderr

    compose = yaml.safe_load((settings.BASE_DIR / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker-gpu-a"} <= set(services)
    devices = services["worker-gpu-a"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]


def _check_deploy(tmp_path, **env: str):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    # The browser tests set DJANGO_ALLOW_ASYNC_UNSAFE for Playwright's event loop in this process;
    # a deployment never has it (the deploy check rightly refuses it), so it is left out here.
    dropped = ("DATABASE_URL", "DEBUG", "TAILTUNE_HTTPS", "DJANGO_ALLOW_ASYNC_UNSAFE")
    clean = {k: v for k, v in os.environ.items() if k not in dropped}
    clean.update(TAILTUNE_DATA=str(tmp_path), ALLOWED_HOSTS="tailtune.example.com", **env)
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=settings.BASE_DIR,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_passes_the_deploy_check_under_the_documented_production_settings(tmp_path) -> None:
    # README "Production": DEBUG off, behind a TLS proxy, a long random SECRET_KEY.
    done = _check_deploy(tmp_path, DEBUG="false", TAILTUNE_HTTPS="true", SECRET_KEY="k" * 20 + "Zq9!x" * 10)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
    # The check is real: the same without the proxy settings names what is missing.
    plain = _check_deploy(tmp_path, DEBUG="false", TAILTUNE_HTTPS="false", SECRET_KEY="k" * 20 + "Zq9!x" * 10)
    assert plain.returncode != 0 and "SECURE_HSTS_SECONDS" in plain.stdout + plain.stderr


def test_hsts_preload_is_the_operators_choice_and_either_way_the_deploy_check_is_clean(tmp_path) -> None:
    import subprocess
    import sys

    production = {"DEBUG": "false", "TAILTUNE_HTTPS": "true", "SECRET_KEY": "k" * 20 + "Zq9!x" * 10}

    def preload(**env: str) -> str:
        clean = {
            k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
        }
        clean.update(
            TAILTUNE_DATA=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings", **production, **env
        )
        code = "from django.conf import settings; print(settings.SECURE_HSTS_PRELOAD, settings.SECURE_HSTS_SECONDS)"
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=settings.BASE_DIR,
            env=clean,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    # Preloading binds every subdomain to HTTPS for months: off unless the operator asks for it.
    assert preload() == "False 31536000"
    assert preload(TAILTUNE_HSTS_PRELOAD="true") == "True 31536000"
    on = _check_deploy(tmp_path, **production, TAILTUNE_HSTS_PRELOAD="true")
    assert on.returncode == 0 and "no issues" in on.stdout, on.stdout + on.stderr


@pytest.mark.django_db
def test_it_asks_at_the_terminal_twice(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import getpass
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.core.management.base import CommandError

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    answers = iter(["a long and rare phrase 7", "a long and rare phrase 8"])
    monkeypatch.setattr(getpass, "getpass", lambda prompt: next(answers))
    with pytest.raises(CommandError, match="the two entries differ"):
        call_command("user_add", "mallory", "--role", "viewer", stdin=Terminal())
    answers = iter(["a long and rare phrase 7"] * 2)
    call_command("user_add", "mallory", "--role", "viewer", stdin=Terminal(), stdout=io.StringIO())
    assert get_user_model().objects.get(username="mallory").check_password("a long and rare phrase 7")


@pytest.mark.django_db
def test_it_validates_a_new_users_password_read_from_standard_input() -> None:
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.core.management.base import CommandError

    def user_add(line: str) -> None:
        args = ("user_add", "mallory", "--password-stdin", "--role", "viewer")
        call_command(*args, stdin=io.StringIO(line), stdout=io.StringIO())

    with pytest.raises(CommandError, match="password: .*too common"):
        user_add("password123\n")
    assert not get_user_model().objects.filter(username="mallory").exists()
    user_add("a long and rare phrase 7\n")
    assert get_user_model().objects.get(username="mallory").check_password("a long and rare phrase 7")


@pytest.mark.django_db
def test_it_never_takes_a_password_from_the_command_line() -> None:
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.core.management.base import CommandError

    # On the command line a password is in ps, /proc/<pid>/cmdline and the shell's history.
    with pytest.raises(CommandError, match="--password: .*--password-stdin"):
        call_command("user_add", "mallory", "--password", "a long and rare phrase 7", "--role", "viewer")
    # Neither flag and no terminal to ask at: refused, naming the way that works.
    with pytest.raises(CommandError, match="--password-stdin"):
        call_command("user_add", "mallory", "--role", "viewer", stdin=io.StringIO("x\n"))
    with pytest.raises(CommandError, match="no password"):
        call_command("user_add", "mallory", "--password-stdin", "--role", "viewer", stdin=io.StringIO(""))
    assert not get_user_model().objects.filter(username="mallory").exists()


@pytest.mark.django_db
def test_it_locks_out_a_username_after_repeated_failed_logins(client, django_user_model) -> None:
    django_user_model.objects.create_user("victim", password="the right horse 42")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = client.post("/accounts/login/", {"username": "victim", "password": "guess"})
        assert response.status_code == 200  # the form again, with its error
    last = client.post("/accounts/login/", {"username": "victim", "password": "guess"})
    assert last.status_code == 429
    # Locked out: even the right password is refused until the cool-off ends.
    locked = client.post("/accounts/login/", {"username": "victim", "password": "the right horse 42"})
    assert locked.status_code == 429
    from axes.models import AccessAttempt

    assert AccessAttempt.objects.filter(username="victim").exists()


def test_it_serves_the_web_through_a_production_server() -> None:
    from apps.runs.management.commands.serve import web_argv

    argv = web_argv("127.0.0.1", 8123, 2)
    assert argv[1:4] == ["-m", "gunicorn", "config.wsgi:application"]
    assert "runserver" not in argv and "--bind" in argv
