"""The quality probe on a started server (apps/experiments/quality.py): greedy answers to the
frozen prompt set, one request at a time, with the token ids vLLM generated.

Run on every sweep run right after warm-up, before the replay: the server is then idle, and
sequential requests keep the outputs independent of batching as far as the engine allows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import httpx

# Greedy and seeded: the same prompt must give the same tokens on the same configuration.
PROBE_SAMPLING = {"temperature": 0.0, "seed": 0}
# The longest wait for one probe answer: a server that takes longer is broken, not slow.
PROBE_TIMEOUT_S = 120.0


def run_probe(
    *,
    base_url: str,
    model: str,
    requests: Sequence[dict[str, Any]],
    stop: threading.Event | None = None,
) -> list[dict[str, Any]]:
    """One output per probe request: index, class, the generated token ids, text, finish reason.

    A request the server refuses keeps its index with ``error`` and no tokens; the analysis
    counts it as disagreeing.
    """
    outputs = []
    with httpx.Client(base_url=base_url.rstrip("/"), timeout=PROBE_TIMEOUT_S) as client:
        for r in requests:
            if stop is not None and stop.is_set():
                break  # cancelled: the run ends as cancelled, with what was answered so far
            body = {
                "model": model,
                "prompt": r.get("prompt_token_ids") or r.get("prompt"),
                "max_tokens": int(r["output_tokens"]),
                "return_token_ids": True,
                **PROBE_SAMPLING,
            }
            entry: dict[str, Any] = {"index": int(r["index"]), "class": r["class"]}
            try:
                response = client.post("/v1/completions", json=body)
                response.raise_for_status()
                choice = response.json()["choices"][0]
                if choice.get("token_ids") is None:
                    raise ValueError(
                        "the server returned no token_ids (does this vLLM take return_token_ids?)"
                    )
                entry.update(
                    token_ids=[int(t) for t in choice.get("token_ids") or []],
                    text=str(choice.get("text") or ""),
                    finish_reason=choice.get("finish_reason"),
                )
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                entry.update(
                    token_ids=[], text="", finish_reason=None, error=f"{type(exc).__name__}: {exc}"[:300]
                )
            outputs.append(entry)
    return outputs
