"""The spec's ``recovery`` section: how the rollback rehearsal runs and what check 4 demands.

Pure: no Django. :func:`check_recovery` returns the normalised options and a
list of ``(field path, message)`` problems; ``spec.validate_spec`` turns them
into field errors. docs/SCENARIOS.md ("Recovery rehearsal") explains each field.

A spec never names a program or a URL: ``switch`` and ``router`` are names the operator
gives each host (``TAILTUNE_SWITCH_COMMANDS``, ``TAILTUNE_ROUTERS``; apps/runs/hosts.py), and
the worker resolves them on its own host. Whether a host able to run the experiment offers
them is checked where the hosts are known (apps/experiments/offers.py). The old fields that
carried an argv list or a URL (``switch_command``, ``route_url``, ``backend_header``) are
refused with an error naming the setting that replaced them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

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
    # Names from the host's TAILTUNE_SWITCH_COMMANDS and TAILTUNE_ROUTERS (both or neither).
    "switch": None,
    "router": None,
    # Fixed ports for the two servers (a router's backend list names them); None: any free port.
    "ports": None,
}
MAX_WINDOW_S = 86_400.0
# A switch or router name, as the host settings spell them (apps/runs/hosts.py).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SETTINGS = {"switch": "TAILTUNE_SWITCH_COMMANDS", "router": "TAILTUNE_ROUTERS"}
# Fields a spec once carried, and the host setting that now holds what they held.
REPLACED = {
    "switch_command": "name one of the host's switch commands (TAILTUNE_SWITCH_COMMANDS) in recovery.switch",
    "route_url": "name one of the host's routers (TAILTUNE_ROUTERS) in recovery.router",
    "backend_header": "the router's backend header is set with it in the host's TAILTUNE_ROUTERS",
}

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
        if key in REPLACED:
            problems.append(
                (f"recovery.{key}", f"a spec cannot name a program or an address any more: {REPLACED[key]}")
            )
        else:
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

    for key, setting in SETTINGS.items():
        name = data.get(key)
        if name is None:
            continue
        if not isinstance(name, str) or not NAME.match(name):
            problems.append(
                (
                    f"recovery.{key}",
                    f"must be a name from the host's {setting} (letters, digits, . _ -), got {str(name)[:80]!r}",
                )
            )
        else:
            out[key] = name
    if (data.get("switch") is None) != (data.get("router") is None):
        missing = "router" if data.get("router") is None else "switch"
        problems.append(
            (
                f"recovery.{missing}",
                f"is required with a router: give switch and router ({SETTINGS[missing]})",
            )
        )

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
