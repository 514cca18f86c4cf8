"""The spec's cells: the frozen controls (with their generation settings), and the baseline's
and candidates' args (the scheduler's, and any other flag of vLLM's parser that is not denied).

Pure: no Django. Each checker reports into the shared ``_Checker`` and fills its section of the
spec; apps/experiments/spec.validate_spec calls them in the spec's order.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, cast

from apps.experiments.generation import GENERATION_FLAGS, GENERATION_KEYS
from apps.experiments.spec_checker import _Checker
from apps.experiments.spec_rules import (
    CELL_ARGS,
    CONTROL_KEYS,
    MAX_KV_BYTES,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_TOKENS,
    SCHEDULING_POLICIES,
)
from apps.experiments.spec_types import CandidateEngine, CandidateSpec, CellArgs, Controls, GenerationSettings
from workers.engine.vllm_args import check_arg


def _check_controls(c: _Checker, top: Mapping[str, Any], spec: dict[str, Any]) -> int | None:
    """The frozen controls, same for every cell: fills ``spec["controls"]``; returns max_model_len."""
    controls = c.mapping(top.get("controls"), "controls")
    c.unknown(controls, CONTROL_KEYS, "controls")
    max_model_len = c.number(
        controls, "max_model_len", "controls", positive=True, integer=True, maximum=MAX_TOKENS
    )
    generation = c.mapping(controls.get("generation"), "controls.generation", required=False)
    checked: Controls = {
        "dtype": c.text(controls, "dtype", "controls", required=False, max_length=32) or "auto",
        "tensor_parallel_size": c.number(
            controls,
            "tensor_parallel_size",
            "controls",
            required=False,
            positive=True,
            integer=True,
            maximum=MAX_PARALLEL,
            default=1,
        ),
        "max_model_len": max_model_len,
        "gpu_memory_utilization": c.number(
            controls, "gpu_memory_utilization", "controls", required=False, positive=True, maximum=1.0
        ),
        "kv_cache_memory_bytes": c.number(
            controls,
            "kv_cache_memory_bytes",
            "controls",
            required=False,
            positive=True,
            integer=True,
            maximum=MAX_KV_BYTES,
        ),
        "enable_prefix_caching": c.boolean(controls, "enable_prefix_caching", "controls", default=False),
        "speculative_decoding": c.boolean(controls, "speculative_decoding", "controls", default=False),
        "seed": c.number(
            controls, "seed", "controls", required=False, integer=True, minimum=0, maximum=MAX_SEED, default=0
        ),
        "generation": _check_generation(c, generation),
    }
    spec["controls"] = checked
    if checked["speculative_decoding"]:
        c.fail(
            "controls.speculative_decoding",
            "speculative decoding is not supported by the engine launcher yet",
        )
    return max_model_len


def _check_candidates(
    c: _Checker, top: Mapping[str, Any], spec: dict[str, Any], max_model_len: int | None
) -> dict[str, str]:
    """The candidate cells, each {id, args} (and an optional engine override): fills
    ``spec["candidates"]``, each cell's args with B0's flags that are not the scheduler's where
    the cell sets none of its own; returns every cell id (the baseline's too) with its path, each once.

    A search spec (a ``search`` section) has no candidates: its confirmed cells come from the
    screening (apps/experiments/spec_search.py)."""
    candidates_raw = top.get("candidates")
    candidates: list[CandidateSpec] = []
    if "search" in top:
        if candidates_raw not in (None, []):
            c.fail("candidates", "a spec has a grid (candidates) or a search, not both: leave one out")
    elif not isinstance(candidates_raw, list) or not candidates_raw:
        c.fail("candidates", "must be a non-empty list of {id, args}")
    else:
        for i, item in enumerate(candidates_raw):
            path = f"candidates[{i}]"
            cand = c.mapping(item, path)
            c.unknown(cand, {"id", "args", "engine", "control"}, path)
            cell: CandidateSpec = {
                "id": c.text(cand, "id", path, max_length=32),
                "args": _check_args(c, cand.get("args"), f"{path}.args", max_model_len),
            }
            if c.boolean(cand, "control", path, default=False):
                # An A/A cell: B0's config run again (spec_cross.py holds it to B0's exactly).
                cell["control"] = True
            if cand.get("engine") is not None:
                # A candidate that is another engine build or model revision, not only other flags.
                engine = c.mapping(cand.get("engine"), f"{path}.engine")
                c.unknown(engine, {"image", "model_revision"}, f"{path}.engine")
                override = {
                    key: c.text(engine, key, f"{path}.engine", required=False, max_length=200)
                    for key in ("image", "model_revision")
                }
                override = {k: v for k, v in override.items() if v}
                if not override and not any(engine.get(k) for k in ("image", "model_revision")):
                    c.fail(f"{path}.engine", "give image and/or model_revision, or leave engine out")
                if override:
                    cell["engine"] = cast(CandidateEngine, override)  # image and/or model_revision
            candidates.append(cell)
    # The flags a sweep does not vary (all but the scheduler's, CELL_ARGS) are B0's in every cell
    # unless the cell sets its own: a candidate differs from production only where it says so.
    held = {k: v for k, v in spec["baseline"]["args"].items() if k not in CELL_ARGS}
    for cell in candidates:
        # A copy each: a value shared between cells would be written as a YAML alias on export.
        cell["args"] = cast(CellArgs, {**copy.deepcopy(held), **cell["args"]})
    spec["candidates"] = candidates
    seen: dict[str, str] = {}
    for path, cell_id in [("baseline.id", spec["baseline"]["id"])] + [
        (f"candidates[{i}].id", cand["id"]) for i, cand in enumerate(candidates)
    ]:
        if not cell_id:
            continue
        if cell_id in seen:
            c.fail(path, f"duplicate cell id {cell_id!r} (also at {seen[cell_id]})")
        else:
            seen[cell_id] = path
    return seen


def _check_args(c: _Checker, raw: Any, path: str, max_model_len: int | None) -> CellArgs:
    args = c.mapping(raw, path)
    out: dict[str, Any] = {}
    for key, value in args.items():
        where = f"{path}.{key}"
        if key in CONTROL_KEYS:
            c.fail(where, "is a frozen control: set it once under controls, not per cell")
            continue
        if key not in CELL_ARGS:
            # Any other flag of vLLM's own parser passes through to the server, unless denied
            # (workers/engine/vllm_args.py; docs/SPEC.md, "Every other vLLM flag").
            problem = check_arg(key, value)
            if problem is not None:
                c.fail(where, problem)
            else:
                out[key] = value
            continue
        kind = CELL_ARGS[key]
        if kind is bool:
            if not isinstance(value, bool):
                c.fail(where, f"must be true or false, got {value!r}")
                continue
            out[key] = value
        elif kind is int:
            number = c.number(args, key, path, positive=True, integer=True)
            if number is not None:
                out[key] = number
        elif key == "scheduling_policy":
            if value not in SCHEDULING_POLICIES:
                c.fail(where, f"must be one of {', '.join(SCHEDULING_POLICIES)}, got {value!r}")
                continue
            out[key] = value
    budget = out.get("max_num_batched_tokens")
    chunked = out.get("enable_chunked_prefill", True)
    if budget is not None and max_model_len is not None and not chunked and budget < max_model_len:
        # vLLM refuses this: without chunking, one prompt must fit in one step.
        c.fail(
            f"{path}.max_num_batched_tokens",
            f"{budget} is below controls.max_model_len ({max_model_len}) with chunked prefill off; "
            "vLLM refuses that (raise it or set enable_chunked_prefill: true)",
        )
    return cast(CellArgs, out)  # CELL_ARGS keys each of its type, and checked pass-through flags


def _check_generation(c: _Checker, data: Mapping[str, Any]) -> GenerationSettings:
    """Known sampling keys only, each a bounded number (or a flag): checked like every other section."""
    path = "controls.generation"
    c.unknown(data, set(GENERATION_KEYS) | set(GENERATION_FLAGS), path)
    out: GenerationSettings = {}
    for key, (kind, low, high) in GENERATION_KEYS.items():
        if key in data:
            out[key] = c.number(data, key, path, integer=kind is int, minimum=low, maximum=high)
    for key in GENERATION_FLAGS:
        if key in data:
            out[key] = c.boolean(data, key, path, default=False)
    return out
