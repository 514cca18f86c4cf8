"""What tests that start the real CPU vLLM share: where it is, whether it is built, its controls."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE_DIR = REPO / ".engine"
MODEL = ENGINE_DIR / "models" / "tiny-llama"
READY = (ENGINE_DIR / "venv" / ".tailtune-engine-stamp").is_file() and (MODEL / "model.safetensors").is_file()

# Marks for a module that starts the engine: `make test` builds it first, so the skip only
# shows when someone runs pytest by hand before `make engine`.
ENGINE_MARKS = [
    pytest.mark.engine,
    pytest.mark.skipif(not READY, reason="CPU engine not built: run `make engine`"),
]

# A 6 MiB KV cache holds 6144 tokens of this model (1 KiB per token): six
# concurrent 1,500-token prompts growing by 800 tokens each cannot all fit, and
# the requests already running get preempted as they grow.
CONTROLS = {
    "dtype": "bfloat16",
    "max_model_len": 4096,
    "kv_cache_memory_bytes": 6 * 1024 * 1024,
    "enable_prefix_caching": False,
    "speculative_decoding": False,
    "seed": 0,
    "revision": "tiny-llama-local-v1",
    "tokenizer_revision": "tiny-llama-local-v1",
    "served_model_name": "tiny",
    "generation": {"temperature": 0.0, "ignore_eos": True},
}
