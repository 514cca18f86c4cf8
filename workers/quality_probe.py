"""The quality probe on a started server (apps/experiments/quality_contract.py): greedy answers to the
frozen prompt set, one request at a time, with the token ids vLLM generated.

Run on every sweep run right after warm-up, before the replay: the server is then idle, and
sequential requests keep the outputs independent of batching as far as the engine allows.
:func:`sweep_probe` takes the run's frozen probe prompts (the pipeline calls it);
:func:`run_probe` sends them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import httpx

from apps.runs.models import Run
from apps.runs.summary_types import ProbeOutput, QualityProbeAnswers
from apps.workloads.services import trace_load
from workers.engine.server import EngineServer

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
) -> list[ProbeOutput]:
    """One output per probe request: index, class, the generated token ids, text, finish reason.

    A request the server refuses keeps its index with ``error`` and no tokens; the analysis
    counts it as disagreeing.
    """
    outputs: list[ProbeOutput] = []
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
            entry: ProbeOutput = {
                "index": int(r["index"]),
                "class": r["class"],
                "token_ids": [],
                "text": "",
                "finish_reason": None,
            }
            try:
                response = client.post("/v1/completions", json=body)
                response.raise_for_status()
                choice = response.json()["choices"][0]
                if choice.get("token_ids") is None:
                    raise ValueError(
                        "the server returned no token_ids (does this vLLM take return_token_ids?)"
                    )
                entry["token_ids"] = [int(t) for t in choice.get("token_ids") or []]
                # PostgreSQL's text and jsonb cannot hold U+0000, which a model may emit (the tiny
                # CPU model does): stored as U+FFFD, the replacement character, so the run's
                # summary can be saved. The token ids stay exact, and exact match uses them.
                entry["text"] = str(choice.get("text") or "").replace("\x00", "\ufffd")
                entry["finish_reason"] = choice.get("finish_reason")
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
            outputs.append(entry)
    return outputs


def sweep_probe(run: Run, server: EngineServer, stop: threading.Event) -> QualityProbeAnswers | None:
    """The quality probe's answers on this sweep run's server, when the experiment has a probe:
    at most ``prompts_per_class`` prompts of each class, each answer at most ``max_tokens``
    (a stored trace named as the probe is held to the same bounds)."""
    sha = run.experiment.workload.quality_probe_sha256
    if not sha or run.kind != Run.Kind.SWEEP:
        return None
    options = ((run.experiment.spec or {}).get("quality") or {}).get("probe") or {}
    per_class, cap = int(options.get("prompts_per_class") or 8), int(options.get("max_tokens") or 32)
    taken: dict[str, int] = {}
    requests = []
    for r in trace_load(sha256=sha).requests:
        if taken.get(r.klass, 0) < per_class:
            taken[r.klass] = taken.get(r.klass, 0) + 1
            requests.append({**r.to_json(), "output_tokens": min(int(r.output_tokens), cap)})
    return {
        "trace_sha256": sha,
        "outputs": run_probe(
            base_url=server.base_url, model=server.served_model_name, requests=requests, stop=stop
        ),
    }
