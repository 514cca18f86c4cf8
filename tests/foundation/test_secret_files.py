"""Secret files (the generated SECRET_KEY, the first admin's password) are born 0600 with their
whole content, and nothing already at their path (a planted symbolic link, an old file) is
followed or replaced."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from config.secretfiles import create_secret_file, read_secret_file


def _settings_key(data: Path, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    """Load the settings in a fresh process on the embedded defaults (no SECRET_KEY, no server)."""
    dropped = ("SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(TAILTUNE_DATA=str(data), DJANGO_SETTINGS_MODULE="config.settings")
    return subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.SECRET_KEY)"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(umask),
    )


def test_the_generated_key_is_born_private_and_kept(tmp_path) -> None:
    first = _settings_key(tmp_path, umask=0)  # an umask that would leave a new file world-readable
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "secret_key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert read_secret_file(key_file) == first.stdout.strip() and len(first.stdout.strip()) >= 50
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".secret_key")) == []
    again = _settings_key(tmp_path)
    assert again.stdout == first.stdout


def test_the_generated_key_is_never_written_through_a_planted_link(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "secret_key").symlink_to(elsewhere / "stolen")  # dangling: exists() says False
    done = _settings_key(data)
    assert not (elsewhere / "stolen").exists(), "the key was written where the link pointed"
    assert done.returncode != 0
    assert "secret_key: cannot read the secret key" in done.stderr and "plain file" in done.stderr


def test_two_processes_starting_together_agree_on_one_key(tmp_path) -> None:
    dropped = ("SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(TAILTUNE_DATA=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings")
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    keys = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert len(keys) == 1 and "" not in keys
    assert keys == {read_secret_file(tmp_path / "secret_key")}


def test_a_secret_file_is_made_whole_and_private_or_not_at_all(tmp_path) -> None:
    old = os.umask(0)
    try:
        create_secret_file(tmp_path / "s", "one")
    finally:
        os.umask(old)
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o600 and (tmp_path / "s").read_text() == "one"
    with pytest.raises(FileExistsError):
        create_secret_file(tmp_path / "s", "two")
    assert (tmp_path / "s").read_text() == "one"
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(FileExistsError):
        create_secret_file(tmp_path / "link", "three")
    assert not (tmp_path / "target").exists()
    with pytest.raises(OSError):
        read_secret_file(tmp_path / "link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "s"]  # no temporary file left


@pytest.mark.django_db
def test_the_first_admins_password_is_never_written_through_a_link_or_over_a_file(tmp_path) -> None:
    from django.contrib.auth import get_user_model

    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    victim.chmod(0o644)
    link = tmp_path / "pw-link"
    link.symlink_to(victim)
    with pytest.raises(CommandError, match="exists already"):
        call_command("ensure_admin", "--password-file", str(link), stdout=io.StringIO())
    assert victim.read_text() == "someone else's file\n" and victim.stat().st_mode & 0o777 == 0o644
    old = tmp_path / "old-password"
    old.write_text("an earlier password\n")
    with pytest.raises(CommandError, match="exists already"):
        call_command("ensure_admin", "--password-file", str(old), stdout=io.StringIO())
    assert old.read_text() == "an earlier password\n"
    assert not get_user_model().objects.filter(is_superuser=True).exists()  # nothing half-made
    fresh = tmp_path / "pw"
    call_command("ensure_admin", "--password-file", str(fresh), stdout=io.StringIO())
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert get_user_model().objects.get(username="admin").check_password(fresh.read_text().strip())
