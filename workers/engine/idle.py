"""The idle check between two traces replayed on one server (engine reuse).

A reused server must start each run as a fresh one would: nothing running or waiting, its
KV cache back to the level it had when it was new and idle, and, where prefix caching is
on, an empty prefix cache. Steps of :func:`idle_check`:

1. Poll /metrics until ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` are
   0 and the KV cache use is within ``KV_TOLERANCE`` of ``kv_idle`` (the level measured
   on the new server after its warm-up) on reads ``STEADY_S`` apart, or until
   ``timeout_s`` passes.
2. When idle and ``reset_prefix_cache`` is set, POST /reset_prefix_cache (a development
   endpoint: the launcher sets ``VLLM_SERVER_DEV_MODE=1`` for such servers, which it starts
   on a loopback bind only; docs/ENGINE.md, "Development endpoints") and require
   ``{"success": true}``.
3. Return what was seen, for the run's record: the run is invalid when ``idle`` is false, and
   the record says why (the last reading, and how many reads showed work or failed, and how
   long the server had been idle when the time ran out).
"""

# No ``from __future__ import annotations``: on Python 3.11 a TypedDict's ``__required_keys__``
# ignores ``NotRequired`` written as a string annotation.
import time
from typing import NotRequired, TypedDict

import httpx

from workers.engine.gauges import latest_gauges
from workers.engine.scrape import parse_metrics

KV_TOLERANCE = 0.005  # KV use is a fraction (0-1): half a percentage point
STEADY_S = 0.5
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
          "vllm:gpu_cache_usage_perc")  # fmt: skip


class IdleCheck(TypedDict):
    """What :func:`idle_check` saw (kept in the run's ``summary["idle_check"]``)."""

    idle: bool
    waited_s: float
    running: float | None
    waiting: float | None
    kv_usage: float | None
    kv_idle: float | None
    prefix_cache_reset: bool | None  # None: not asked (no prefix caching, or not idle)
    # How the check went: reads of /metrics, how many showed work in the engine and how many
    # failed, and how long the server had been idle at the last read (not yet STEADY_S: the
    # time ran out before idle could be confirmed; None: it was not idle then).
    reads: int
    busy_reads: int
    failed_reads: int
    idle_for_s: float | None
    error: NotRequired[str]  # the last read failed
    last_error: NotRequired[str]  # some read failed


def gauges_now(client: httpx.Client, base_url: str) -> dict[str, float | None]:
    """Running, waiting and KV use from one /metrics scrape."""
    response = client.get(base_url + "/metrics")
    response.raise_for_status()
    return latest_gauges(parse_metrics(response.text, names=GAUGES))


def idle_check(
    base_url: str,
    *,
    kv_idle: float | None,
    reset_prefix_cache: bool,
    timeout_s: float = 30.0,
    poll_s: float = 0.25,
    client: httpx.Client | None = None,
) -> IdleCheck:
    """Steps 1-3 (module docstring). ``kv_idle`` None: measure only (a new server)."""
    own = client is None
    http = client or httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0))
    started = time.monotonic()
    seen: dict[str, float | None] = {}
    idle = False
    idle_since: float | None = None
    error = last_error = ""
    reads = busy_reads = failed_reads = 0
    try:
        while True:
            reads += 1
            try:
                seen = gauges_now(http, base_url)
                error = ""
            except httpx.HTTPError as exc:
                error = last_error = f"/metrics: {exc}"
                failed_reads += 1
            quiet = not error and _is_idle(seen, kv_idle)
            if not error and not quiet:
                busy_reads += 1
            if quiet:
                # Idle on two reads at least STEADY_S apart: one read may be a gauge not yet
                # updated for requests that just arrived.
                if idle_since is not None and time.monotonic() - idle_since >= STEADY_S:
                    idle = True
                    break
                idle_since = idle_since if idle_since is not None else time.monotonic()
            else:
                idle_since = None
            if time.monotonic() - started >= timeout_s:
                break
            time.sleep(poll_s)
        reset: bool | None = None
        if idle and reset_prefix_cache:
            try:
                response = http.post(base_url + "/reset_prefix_cache")
                reset = response.status_code == 200 and bool(response.json().get("success"))
            except (httpx.HTTPError, ValueError):
                reset = False
    finally:
        if own:
            http.close()
    out: IdleCheck = {
        "idle": idle and reset is not False,
        "waited_s": round(time.monotonic() - started, 3),
        "running": seen.get("running"),
        "waiting": seen.get("waiting"),
        "kv_usage": seen.get("kv_usage"),
        "kv_idle": kv_idle,
        "prefix_cache_reset": reset,
        "reads": reads,
        "busy_reads": busy_reads,
        "failed_reads": failed_reads,
        "idle_for_s": round(time.monotonic() - idle_since, 3) if idle_since is not None else None,
    }
    if error:
        out["error"] = error
    if last_error:
        out["last_error"] = last_error
    return out


def _is_idle(seen: dict[str, float | None], kv_idle: float | None) -> bool:
    if seen.get("running") or seen.get("waiting"):
        return False
    if seen.get("running") is None or seen.get("waiting") is None:
        return False
    if kv_idle is None or seen.get("kv_usage") is None:
        return True
    return float(seen["kv_usage"] or 0.0) <= kv_idle + KV_TOLERANCE


def not_idle_reason(check: IdleCheck) -> str:
    """The invalid run's reason: what the server was doing when the check gave up."""
    if check.get("prefix_cache_reset") is False:
        return "server not reset at the run's start: /reset_prefix_cache did not succeed"
    kv = check.get("kv_usage")
    kv_text = "unknown" if kv is None else f"{100 * kv:.1f}%"
    kv_idle = check.get("kv_idle")
    idle_text = "" if kv_idle is None else f" (idle {100 * kv_idle:.1f}%)"
    said = (
        f"server not idle at the run's start after {check.get('waited_s', 0):g} s: "
        f"{check.get('running')} running, {check.get('waiting')} waiting, KV {kv_text}{idle_text}"
    )
    if check.get("busy_reads"):
        said += f"; busy on {check['busy_reads']} of {check['reads']} reads"
    if check.get("error"):
        said += f"; {check['error']}"
    elif check.get("failed_reads"):
        said += (
            f"; {check['failed_reads']} of {check['reads']} reads failed (last: {check.get('last_error')})"
        )
    if check.get("idle_for_s") is not None:
        said += f"; idle for only {check['idle_for_s']:g} s when the time ran out ({STEADY_S:g} s needed)"
    return said
