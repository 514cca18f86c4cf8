"""What ships for a deployment: an image that runs as a user who is not root, and a compose file
whose passwords come from an env file that is never committed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent.parent


def _instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_the_image_runs_as_a_user_that_is_not_root_and_owns_only_its_data() -> None:
    steps = _instructions()
    keywords = [k for k, _ in steps]
    users = [rest for k, rest in steps if k == "USER"]
    assert users, "no USER: the processes would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    assert keywords.index("CMD") > len(keywords) - 1 - keywords[::-1].index("USER")  # CMD after it
    data = next(
        rest.split("=", 1)[1] for k, rest in steps if k == "ENV" and rest.startswith("TAILTUNE_DATA=")
    )
    owned = [rest for k, rest in steps if k == "RUN" and f"chown {user}" in rest and data in rest]
    assert owned, f"{data} (TAILTUNE_DATA) is not given to user {user}"
    # The code is copied as root's and is never handed over: a process cannot rewrite it.
    assert not any("--chown" in rest for k, rest in steps if k == "COPY")
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"var", ".env", ".venv", ".git"} <= set(ignored)  # var/ may hold secret_key


def test_compose_takes_its_passwords_from_an_env_file_that_is_never_committed() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    secrets = []
    for name, service in compose["services"].items():
        env = service.get("environment") or {}
        for key in ("POSTGRES_PASSWORD", "DATABASE_URL", "SECRET_KEY"):
            if key in env:
                secrets.append((name, key, str(env[key])))
    assert {(n, k) for n, k, _ in secrets} >= {("postgres", "POSTGRES_PASSWORD"), ("web", "DATABASE_URL")}
    for name, key, value in secrets:
        assert "${" in value and ":?" in value, f"{name}.{key} is written in the file: {value}"
    assert "tailtune:tailtune@" not in (REPO / "docker-compose.yml").read_text()
    example = (REPO / ".env.example").read_text()
    assert re.search(r"^POSTGRES_PASSWORD=$", example, re.M) and re.search(r"^SECRET_KEY=$", example, re.M)
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO, timeout=30)
    assert ignored.returncode == 0, ".env is not ignored by git"
    kept = subprocess.run(["git", "check-ignore", "-q", ".env.example"], cwd=REPO, timeout=30)
    assert kept.returncode == 1, ".env.example must be committed"
