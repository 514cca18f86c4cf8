"""The host registry: which machines serve candidates, and their heartbeats."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.analysis.cost import valid_price
from apps.runs.models import Host

# A host whose last heartbeat is older than this is not alive: no run is sent to it, and the
# run it held is failed and requeued (apps/runs/services.hosts_reap_lost).
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
    import json

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


def host_register_local(*, hardware_id: str | None = None) -> Host:
    """Register (or refresh) the host this process runs on, from the environment.

    ``TAILTUNE_HOST`` names it; ``TAILTUNE_VLLM_COMMAND`` (a JSON list) is its
    vLLM argv prefix, defaulting to the CPU engine built by ``make engine``;
    ``TAILTUNE_DEVICES`` becomes CUDA_VISIBLE_DEVICES for its servers;
    ``TAILTUNE_IMAGE_DIGEST`` names the container image the command runs;
    ``TAILTUNE_VLLM_COMMANDS`` (a JSON object) lists other engine builds by the
    image name a candidate's ``engine.image`` gives; ``TAILTUNE_USD_PER_GPU_HOUR``
    prices one of its GPUs per hour for the report's cost per 1M output tokens.
    ``hardware_id`` (the worker detects it: workers/engine/confirm.local_hardware_id) is
    what experiments are pinned to; None keeps the recorded one.
    """
    import json

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
    host, _ = Host.objects.update_or_create(
        name=name,
        defaults={
            "queue": host_queue(name),
            "vllm_command": command,
            "engines": engines,
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
