"""controls.generation: the sampling settings every request of every cell carries.

Pure (no Django): the spec checks them against these bounds, the worker puts
:func:`request_sampling` into every request body, each run records what its
requests carried, and the validity check compares that with the experiment's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# key -> (type, minimum, maximum); each is a field of vLLM's completion request.
GENERATION_KEYS: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 100.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, -1, 1_000_000),
    "min_p": (float, 0.0, 1.0),
    "seed": (int, 0, 2**63 - 1),
    "repetition_penalty": (float, 0.0, 100.0),
    "presence_penalty": (float, -2.0, 2.0),
    "frequency_penalty": (float, -2.0, 2.0),
}
# Flags the spec accepts but the replay's output mode decides (exact replay forces ignore_eos).
GENERATION_FLAGS = ("ignore_eos",)


def request_sampling(generation: Mapping[str, Any] | None) -> dict[str, Any]:
    """The sampling fields a request body carries for these settings (sorted, flags left out)."""
    return {k: generation[k] for k in sorted(GENERATION_KEYS) if generation and k in generation}
