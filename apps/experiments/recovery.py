"""The spec's ``recovery`` section: how the rollback rehearsal runs and what check 4 demands.

Pure: no Django. :func:`check_recovery` returns the normalised options and a
list of ``(field path, message)`` problems; ``spec.validate_spec`` turns them
into field errors. docs/SCENARIOS.md ("Recovery rehearsal") explains each field.

``switch_command`` is an argv list, never a shell string: it is run without a
shell, and each item must be a plain token (no whitespace, quotes or shell
metacharacters), as the launcher's flag values are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import urlsplit

from apps.experiments.spec_types import RecoverySpec, StoredSpec

STANDBY_MODES = ("warm", "cold")
DEFAULTS: dict[str, Any] = {
    # On by default: the decision's proposed cell is rehearsed after the analysis.
    "rehearse": True,
    "standby": "warm",
    # Seconds from the trace's start; None: the middle of the observation window.
    "switch_at_s": None,
    "max_recovery_s": 60.0,
    # The rolling window of the time-to-recover measure (docs/ANALYSIS.md).
    "window_s": 10.0,
    # Which frozen trace: None = the first mixture, at its highest agreed rate.
    "mixture": None,
    "rate": None,
    "switch_command": None,
    "route_url": None,
    "backend_header": None,
    # Fixed ports for the two servers (a router's backend list names them); None: any free port.
    "ports": None,
}
MAX_COMMAND_ITEMS = 64
MAX_ITEM_CHARS = 1000
MAX_WINDOW_S = 86_400.0
_PROGRAM = re.compile(r"^[A-Za-z0-9_./+][A-Za-z0-9_./+-]*$")
_ARG = re.compile(r"^[A-Za-z0-9._:/@+=,%?&~#\[\]-]+$")
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")

Problems = list[tuple[str, str]]


def default_switch_at_s(warmup_s: float, observation_s: float) -> float:
    return float(warmup_s) + float(observation_s) / 2.0


def _number(data: Mapping[str, Any], key: str, problems: Problems, *, maximum: float) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        problems.append((f"recovery.{key}", f"must be a number, got {value!r}"))
        return None
    if value <= 0:
        problems.append((f"recovery.{key}", f"must be positive, got {value!r}"))
        return None
    if value > maximum:
        problems.append((f"recovery.{key}", f"must be at most {maximum:g}, got {value!r}"))
        return None
    return float(value)


def check_command(value: Any, path: str = "recovery.switch_command") -> tuple[list[str] | None, Problems]:
    """An argv list of plain tokens, or the problems with it."""
    if isinstance(value, str):
        return None, [(path, "must be a list of arguments (an argv list), not a string: no shell runs it")]
    if not isinstance(value, list) or not value:
        return None, [(path, "must be a non-empty list of arguments")]
    if len(value) > MAX_COMMAND_ITEMS:
        return None, [(path, f"has {len(value)} items; at most {MAX_COMMAND_ITEMS}")]
    problems: Problems = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(item, str) or not item:
            problems.append((where, "must be a non-empty string"))
        elif len(item) > MAX_ITEM_CHARS:
            problems.append((where, f"is {len(item)} characters; at most {MAX_ITEM_CHARS}"))
        elif i == 0 and not _PROGRAM.match(item):
            problems.append((where, "must be a program name or path (letters, digits, . _ / + -)"))
        elif not _ARG.match(item):
            problems.append(
                (
                    where,
                    "must be a plain token: no whitespace, quotes or shell characters ($ ; | ` < > ( ) * \\)",
                )
            )
    return (None if problems else list(value)), problems


def check_recovery(
    raw: Any, *, warmup_s: float | None, observation_s: float | None
) -> tuple[RecoverySpec, Problems]:
    """Normalise ``recovery`` (absent: the defaults) against the trace's windows."""
    problems: Problems = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return cast(RecoverySpec, dict(DEFAULTS)), [("recovery", "must be a mapping")]
    data = {str(k): v for k, v in raw.items()}
    for key in sorted(set(data) - set(DEFAULTS)):
        problems.append((f"recovery.{key}", "unknown field"))
    out = dict(DEFAULTS)

    rehearse = data.get("rehearse", True)
    if not isinstance(rehearse, bool):
        problems.append(("recovery.rehearse", f"must be true or false, got {rehearse!r}"))
    else:
        out["rehearse"] = rehearse
    standby = data.get("standby", "warm")
    if standby not in STANDBY_MODES:
        problems.append(("recovery.standby", f"must be one of {', '.join(STANDBY_MODES)}, got {standby!r}"))
    else:
        out["standby"] = standby

    for key in ("max_recovery_s", "window_s"):
        value = _number(data, key, problems, maximum=MAX_WINDOW_S)
        if value is not None:
            out[key] = value
    switch = _number(data, "switch_at_s", problems, maximum=MAX_WINDOW_S)
    if warmup_s is not None and observation_s is not None:
        end = float(warmup_s) + float(observation_s)
        if switch is not None and switch >= end:
            problems.append(
                (
                    "recovery.switch_at_s",
                    f"{switch:g} s is after the end of the trace (warm-up + observation = {end:g} s)",
                )
            )
            switch = None
    out["switch_at_s"] = switch

    for key in ("mixture", "rate"):
        value = data.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            problems.append((f"recovery.{key}", "must be a name"))
        elif value is not None:
            out[key] = value

    command = data.get("switch_command")
    if command is not None:
        out["switch_command"], found = check_command(command)
        problems += found
    url = data.get("route_url")
    if url is not None:
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            port_ok = parts is not None and (parts.port is None or parts.port > 0)
        except ValueError:  # a bracket left open, a port out of range
            parts, port_ok = None, False
        if parts is None or not port_ok or parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(("recovery.route_url", f"must be an http(s) URL with a valid port, got {url!r}"))
        else:
            out["route_url"] = url.rstrip("/")
    if (command is None) != (url is None):
        missing = "route_url" if url is None else "switch_command"
        problems.append(
            (f"recovery.{missing}", "is required with a router: give switch_command and route_url")
        )
    header = data.get("backend_header")
    if header is not None:
        if not isinstance(header, str) or not _HEADER.match(header):
            problems.append(("recovery.backend_header", f"must be an HTTP header name, got {header!r}"))
        elif url is None:
            problems.append(("recovery.backend_header", "is read from the router's answers: give route_url"))
        else:
            out["backend_header"] = header

    ports = data.get("ports")
    if ports is not None:
        if not isinstance(ports, Mapping) or set(ports) != {"candidate", "b0"}:
            problems.append(("recovery.ports", "must be a mapping with candidate and b0"))
        else:
            good = {}
            for who, port in ports.items():
                if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
                    problems.append(
                        (f"recovery.ports.{who}", f"must be a port from 1024 to 65535, got {port!r}")
                    )
                else:
                    good[str(who)] = port
            if len(good) == 2 and good["candidate"] == good["b0"]:
                problems.append(("recovery.ports.b0", "must differ from the candidate's port"))
            elif len(good) == 2:
                out["ports"] = good
    return cast(RecoverySpec, out), problems  # every key of DEFAULTS, each checked


def recovery_options(spec: StoredSpec) -> RecoverySpec:
    """The recovery options of a stored (validated) spec, with the switch time filled in.

    ``spec`` is a NormalizedSpec as stored, perhaps before it had a ``recovery`` section: the
    defaults fill in what it lacks.
    """
    options = {**DEFAULTS, **(spec.get("recovery") or {})}
    w = spec.get("workload") or {}
    if options["switch_at_s"] is None and w:
        options["switch_at_s"] = default_switch_at_s(w["warmup_s"], w["observation_s"])
    return cast(RecoverySpec, options)
