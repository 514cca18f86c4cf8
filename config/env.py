"""Small typed readers for settings taken from the environment.

Each one fails loudly, naming the variable, when a value cannot be parsed:
a typo in a deployment must stop the process, not silently fall back.
"""

from __future__ import annotations

import os


class ImproperEnv(ValueError):
    pass


def envstr(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperEnv(f"{name}={raw!r} is not a boolean (use true/false, 1/0, yes/no, on/off)")


def envint(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperEnv(f"{name}={raw!r} is not an integer") from None


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]
