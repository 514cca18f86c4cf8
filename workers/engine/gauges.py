"""The vLLM gauges the live page shows, by the names vLLM's /metrics gives them (old and new)."""

from __future__ import annotations

from typing import Any

GAUGE_NAMES: dict[str, tuple[str, ...]] = {
    "waiting": ("vllm:num_requests_waiting",),
    "running": ("vllm:num_requests_running",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
}


def latest_gauges(samples: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each gauge's newest value among scraped samples, in scrape order (None when not seen)."""
    out: dict[str, float | None] = dict.fromkeys(GAUGE_NAMES)
    for key, names in GAUGE_NAMES.items():
        for sample in reversed(samples):
            if sample.get("name") in names and sample.get("value") is not None:
                out[key] = float(sample["value"])
                break
    return out
