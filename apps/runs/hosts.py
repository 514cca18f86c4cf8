"""The host registry: which machines serve candidates, and their heartbeats."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.analysis.cost import valid_price
from apps.runs.models import Host

# A host whose last heartbeat is older than this is not alive: no run is sent to it, and the
# run it held is failed and requeued (apps/lifecycle/retries.hosts_reap_lost).
HEARTBEAT_TIMEOUT = timedelta(seconds=90)


def hosts_alive(*, max_model_len: int | None = None) -> list[Host]:
    """The enabled hosts with a fresh heartbeat that can serve ``max_model_len``, by name."""
    cutoff = timezone.now() - HEARTBEAT_TIMEOUT
    qs = Host.objects.filter(enabled=True, last_heartbeat__gte=cutoff).order_by("name")
    if max_model_len:
        qs = qs.filter(Q(max_model_len__isnull=True) | Q(max_model_len__gte=max_model_len))
    return list(qs)


def host_queue(name: str) -> str:
    return f"host.{name}"


def _engines(raw: str) -> dict[str, list[str]]:
    """``TAILTUNE_VLLM_COMMANDS``: a JSON object, image name -> argv prefix (as TAILTUNE_VLLM_COMMAND)."""
    if not raw:
        return {}
    try:
        engines = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"TAILTUNE_VLLM_COMMANDS is not a JSON object: {exc}") from None
    if not isinstance(engines, dict) or not all(
        isinstance(k, str) and k and isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
        for k, v in engines.items()
    ):
        raise ValueError(
            'TAILTUNE_VLLM_COMMANDS must map image names to argv lists, e.g. {"vllm:v0.33.0": ["vllm", "serve"]}'
        )
    return engines


# The operator's names a spec's ``recovery.switch`` / ``recovery.router`` may give.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")
# Whole-argument placeholders of a switch command: an argv item exactly equal to one of them is
# replaced by that URL when the command runs (never spliced into a longer item). The same URLs
# are in the command's environment (workers/switch._run_switch_command).
SWITCH_PLACEHOLDERS = ("{candidate_url}", "{b0_url}")
SWITCH_EXAMPLE = '{"to-b0": ["/opt/router/switch", "--to", "{b0_url}"]}'
ROUTER_EXAMPLE = '{"prod": {"url": "http://router.internal:8000", "backend_header": "X-Served-By"}}'


def _json_object(raw: str, variable: str, example: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{variable} is not a JSON object: {exc}; e.g. {example}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{variable} must be a JSON object, e.g. {example}")
    for name in value:
        if not _NAME.match(name):
            raise ValueError(
                f"{variable}: {name[:70]!r} is not a name (letters, digits, . _ -, at most 64 characters)"
            )
    return value


def switch_commands(raw: str) -> dict[str, list[str]]:
    """``TAILTUNE_SWITCH_COMMANDS``: a JSON object, name -> argv (run without a shell at a
    rehearsal's switch). An item may be exactly ``{candidate_url}`` or ``{b0_url}``; a longer item
    that holds one is refused, since nothing is spliced into an argument. ValueError naming the
    variable for anything else."""
    if not raw.strip():
        return {}
    commands = _json_object(raw, "TAILTUNE_SWITCH_COMMANDS", SWITCH_EXAMPLE)
    for name, argv in commands.items():
        if not isinstance(argv, list) or not argv or not all(isinstance(x, str) and x for x in argv):
            raise ValueError(
                f"TAILTUNE_SWITCH_COMMANDS[{name!r}] must be a non-empty list of non-empty strings, "
                f"e.g. {SWITCH_EXAMPLE}"
            )
        if argv[0] in SWITCH_PLACEHOLDERS:
            raise ValueError(f"TAILTUNE_SWITCH_COMMANDS[{name!r}]: the program cannot be a placeholder")
        for item in argv:
            if item not in SWITCH_PLACEHOLDERS and ("{candidate_url}" in item or "{b0_url}" in item):
                raise ValueError(
                    f"TAILTUNE_SWITCH_COMMANDS[{name!r}]: {item[:80]!r} holds a placeholder inside a longer "
                    "argument; a placeholder must be a whole argument (or read TAILTUNE_CANDIDATE_URL / "
                    "TAILTUNE_B0_URL from the environment)"
                )
    return commands


def routers(raw: str) -> dict[str, dict[str, str]]:
    """``TAILTUNE_ROUTERS``: a JSON object, name -> {"url": the router's http(s) base URL,
    "backend_header": the header naming the backend that answered (optional)}. ValueError naming
    the variable for anything else."""
    if not raw.strip():
        return {}
    out: dict[str, dict[str, str]] = {}
    for name, router in _json_object(raw, "TAILTUNE_ROUTERS", ROUTER_EXAMPLE).items():
        where = f"TAILTUNE_ROUTERS[{name!r}]"
        if not isinstance(router, dict) or not set(router) <= {"url", "backend_header"}:
            raise ValueError(f"{where} must be an object with url and backend_header, e.g. {ROUTER_EXAMPLE}")
        url, header = router.get("url"), router.get("backend_header", "")
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            port_ok = parts is not None and (parts.port is None or parts.port > 0)
        except ValueError:  # a bracket left open, a port out of range
            parts, port_ok = None, False
        if parts is None or not port_ok or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{where}.url must be an http(s) URL with a valid port, got {str(url)[:80]!r}")
        if header and (not isinstance(header, str) or not _HEADER.match(header)):
            raise ValueError(f"{where}.backend_header must be an HTTP header name, got {str(header)[:80]!r}")
        out[name] = {"url": str(url).rstrip("/"), "backend_header": header or ""}
    return out


def local_switch_commands() -> dict[str, list[str]]:
    """This process's ``TAILTUNE_SWITCH_COMMANDS`` (what the worker runs: never a database row)."""
    return switch_commands(os.environ.get("TAILTUNE_SWITCH_COMMANDS", ""))


def local_routers() -> dict[str, dict[str, str]]:
    """This process's ``TAILTUNE_ROUTERS`` (what the worker reaches: never a database row)."""
    return routers(os.environ.get("TAILTUNE_ROUTERS", ""))


def host_register_local(*, hardware_id: str | None = None) -> Host:
    """Register (or refresh) the host this process runs on, from the environment.

    ``TAILTUNE_HOST`` names it; ``TAILTUNE_VLLM_COMMAND`` (a JSON list) is its
    vLLM argv prefix, defaulting to the CPU engine built by ``make engine``;
    ``TAILTUNE_DEVICES`` becomes CUDA_VISIBLE_DEVICES for its servers;
    ``TAILTUNE_IMAGE_DIGEST`` names the container image the command runs;
    ``TAILTUNE_VLLM_COMMANDS`` (a JSON object) lists other engine builds by the
    image name a candidate's ``engine.image`` gives; ``TAILTUNE_USD_PER_GPU_HOUR``
    prices one of its GPUs per hour for the report's cost per 1M output tokens;
    ``TAILTUNE_SWITCH_COMMANDS`` and ``TAILTUNE_ROUTERS`` (JSON objects) name the switch
    commands and routers a rehearsal on this host may use (:func:`switch_commands`,
    :func:`routers`): the row advertises them to the create page and the spec check;
    ``TAILTUNE_MODEL_ROOTS`` (settings) are where its models may lie; ``TAILTUNE_BIND_HOST``
    is the address its servers bind (loopback unless set; vLLM's development endpoints are
    only ever on behind a loopback bind, workers/engine/launcher.py).
    ``hardware_id`` (the worker detects it: workers/engine/confirm.local_hardware_id) is
    what experiments are pinned to; None keeps the recorded one.
    """
    name = settings.TAILTUNE_HOST
    raw = os.environ.get("TAILTUNE_VLLM_COMMAND", "")
    if raw:
        try:
            command = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"TAILTUNE_VLLM_COMMAND is not a JSON list: {exc}") from None
        if not isinstance(command, list) or not all(isinstance(x, str) for x in command) or not command:
            raise ValueError('TAILTUNE_VLLM_COMMAND must be a JSON list of strings, e.g. ["vllm", "serve"]')
    else:
        engine_python = settings.ENGINE_DIR / "venv" / "bin" / "python"
        command = [
            str(engine_python if engine_python.exists() else sys.executable),
            "-m",
            "vllm.entrypoints.openai.api_server",
        ]
    engines = _engines(os.environ.get("TAILTUNE_VLLM_COMMANDS", ""))
    price = _price(os.environ.get("TAILTUNE_USD_PER_GPU_HOUR", ""))
    switches, offered_routers = local_switch_commands(), local_routers()
    host, _ = Host.objects.update_or_create(
        name=name,
        defaults={
            "queue": host_queue(name),
            "vllm_command": command,
            "engines": engines,
            "switches": switches,
            "routers": offered_routers,
            # Where a model may lie on this host (settings TAILTUNE_MODEL_ROOTS): the spec check
            # accepts a path under them; the worker checks its own setting again at each start.
            "model_roots": [str(root) for root in settings.TAILTUNE_MODEL_ROOTS],
            "devices": os.environ.get("TAILTUNE_DEVICES", ""),
            "bind_host": os.environ.get("TAILTUNE_BIND_HOST", "127.0.0.1"),
            "image_digest": os.environ.get("TAILTUNE_IMAGE_DIGEST", ""),
            "usd_per_gpu_hour": price,
            **({"hardware_id": hardware_id[:300]} if hardware_id is not None else {}),
            "enabled": True,
            "last_heartbeat": timezone.now(),
        },
    )
    return host


def _price(raw: str) -> float | None:
    """TAILTUNE_USD_PER_GPU_HOUR: a positive number of dollars per GPU-hour, or unset."""
    if not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not valid_price(value):
        raise ValueError(f"TAILTUNE_USD_PER_GPU_HOUR must be a positive number of dollars, not {raw!r:.40}")
    return value
