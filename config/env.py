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


def envurls(name: str) -> dict[str, str]:
    """Named http(s) base URLs: a JSON object, name -> URL (``{"prod": "http://vllm.internal:8000"}``).
    A name is letters, digits, ``. _ -`` (at most 64); a URL has a scheme, a host and a valid port.
    Anything else stops the process naming the variable. Unset or empty: none."""
    import json
    import re
    from urllib.parse import urlsplit

    raw = os.environ.get(name, "")
    if not raw.strip():
        return {}
    example = '{"prod": "http://vllm.internal:8000"}'
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImproperEnv(f"{name} is not a JSON object: {exc}; e.g. {example}") from None
    if not isinstance(value, dict):
        raise ImproperEnv(f"{name} must be a JSON object of names to URLs, e.g. {example}")
    out: dict[str, str] = {}
    for key, url in value.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", key):
            raise ImproperEnv(
                f"{name}: {key[:70]!r} is not a name (letters, digits, . _ -, at most 64 characters)"
            )
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            port_ok = parts is not None and (parts.port is None or parts.port > 0)
        except ValueError:  # a bracket left open, a port out of range
            parts, port_ok = None, False
        if parts is None or not port_ok or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ImproperEnv(
                f"{name}[{key!r}] must be an http(s) URL with a valid port, got {str(url)[:80]!r}"
            )
        out[key] = url.rstrip("/")
    return out


def envpaths(name: str, default: list[str]) -> list[str]:
    """Absolute directories: a JSON list (``["/models", "/data/hf"]``) or an ``os.pathsep``-separated
    list (``/models:/data/hf``). Each is normalised; a relative one, one holding ``..`` or a
    control character, or an empty list stops the process naming the variable."""
    import json

    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        items = list(default)
    elif raw.lstrip().startswith("["):
        try:
            items = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ImproperEnv(f"{name} is not a JSON list: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ImproperEnv(f'{name} must be a JSON list of directories, e.g. ["/models"]')
    else:
        items = [item.strip() for item in raw.split(os.pathsep) if item.strip()]
    if not items:
        raise ImproperEnv(f"{name} names no directory")
    out: list[str] = []
    for item in items:
        bad = any(ord(ch) < 32 or ord(ch) == 127 for ch in item) or ".." in item.split("/")
        if bad or not os.path.isabs(item):
            raise ImproperEnv(f"{name}: {item[:200]!r} is not an absolute directory path without '..'")
        out.append(os.path.normpath(item))
    return out
