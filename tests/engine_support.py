"""What tests that start the real CPU vLLM share: where it is, whether it is built, its controls.

``engine_missing()`` is the one answer to "is the engine built?" for every test that starts it,
directly (a launcher, a replay) or through a worker process: both halves of
``scripts/engine-setup.sh`` (the venv, then the tiny model) wrote their stamps, which each writes
only once its half has finished. The worker finds the engine where the settings say
(``TAILTUNE_ENGINE_DIR``, ``.engine`` by default), and so do the tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

ENGINE_DIR = Path(settings.ENGINE_DIR)
MODEL = ENGINE_DIR / "models" / "tiny-llama"
_STAMPS = (ENGINE_DIR / "venv" / ".tailtune-engine-stamp", MODEL / ".tailtune-model-stamp")


def engine_missing() -> str | None:
    """Why the CPU engine cannot serve a test here, or None when `make engine` has built it."""
    missing = [str(stamp) for stamp in _STAMPS if not stamp.is_file()]
    if missing:
        return f"CPU engine not built (no {', '.join(missing)}): run `make engine` (make test does)"
    return None


# A skip, with the reason, for a test that needs the engine: `make test` builds it first, so the
# skip only shows when someone runs pytest by hand before `make engine` (and in CI it fails the
# run: tests/ci_skips.py).
REQUIRES_ENGINE = pytest.mark.skipif(engine_missing() is not None, reason=engine_missing() or "built")
# Marks for a module that starts the engine.
ENGINE_MARKS = [pytest.mark.engine, REQUIRES_ENGINE]

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
