"""Cross-checks of a spec: rules that span its sections and catch a wrong sweep before it runs.

Pure: no Django. ``check_cross`` runs after every section has been checked on its own
(apps/experiments/spec.validate_spec calls it last) and reports into the same ``_Checker``, so
its errors name a field path like every other and nothing is saved. Each rule reads the
normalised spec; a cell whose own fields already have errors is left out of the rules that
compare cells, so a typo is reported once, where it is.

1. A class with a non-zero ``priority`` while a cell schedules first-come-first-served
   (``scheduling_policy: fcfs``, vLLM's default): vLLM's API refuses a priority other than 0
   without priority scheduling, so that class's requests would measure an error or an order the
   server never applied. The error is at the class's priority and names the cells.
2. Two cells with the same effective config (their args after vLLM's parser defaults, and the
   same engine): the sweep would measure one configuration twice and call it two. Allowed only
   when one is marked ``control: true``, an A/A cell: B0's config run again, whose difference
   from B0 the report shows as the measured noise floor. A control must be B0's effective
   config exactly, on B0's engine.
3. With chunked prefill off, a token budget (``max_num_batched_tokens``) below the longest
   class's prompt: no request of that class fits in one scheduler step. The check against
   ``controls.max_model_len`` (spec_cells.py) already refuses such a budget when the length is
   known; this one names the class, and speaks only where that one did not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from apps.experiments.spec_checker import _Checker
from workers.engine.confirm import VLLM_DEFAULTS

# vLLM's parser defaults of the flags whose default is a value, for the pinned version (its flag
# catalogue, workers/engine/vllm_args.py, as workers/engine/confirm.py reads it): an arg left out
# runs with these. A flag whose default the engine resolves at start-up (max_num_seqs,
# max_num_batched_tokens, enable_chunked_prefill: None in the parser) has no entry, so a cell that
# sets it is never taken for one that leaves it out.
PARSER_DEFAULTS: Mapping[str, Any] = VLLM_DEFAULTS
FCFS = "fcfs"


def effective_config(args: Mapping[str, Any], engine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A cell's args after vLLM's parser defaults, with the engine it names (image, model
    revision; empty: the experiment's). Two cells with equal results run the same server."""
    merged = {**PARSER_DEFAULTS, **args}
    return {"args": {k: _plain(v) for k, v in sorted(merged.items())}, "engine": dict(engine or {})}


def _plain(value: Any) -> Any:
    # 2048 and 2048.0 are one budget; a flag stays a flag.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


def _cells(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(path, cell) for B0 then every candidate, as the spec lists them."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    baseline = spec.get("baseline")
    if isinstance(baseline, Mapping):
        out.append(("baseline", baseline))
    for i, cand in enumerate(spec.get("candidates") or []):
        if isinstance(cand, Mapping):
            out.append((f"candidates[{i}]", cand))
    return out


def _name(path: str, cell: Mapping[str, Any]) -> str:
    return str(cell.get("id") or path)


def _has_errors(c: _Checker, path: str) -> bool:
    return any(e.path == path or e.path.startswith(path + ".") for e in c.errors)


def check_cross(c: _Checker, spec: Mapping[str, Any]) -> None:
    """Every cross-check, in the order of the module's docstring."""
    cells = _cells(spec)
    _priority_under_fcfs(c, spec, cells)
    _same_effective_config(c, cells)
    _budget_below_prompt(c, spec, cells)


def _policy(cell: Mapping[str, Any]) -> tuple[str, bool]:
    """(the cell's scheduling policy, whether its args set it)."""
    args = cell.get("args") or {}
    if "scheduling_policy" in args:
        return str(args["scheduling_policy"]), True
    return str(PARSER_DEFAULTS.get("scheduling_policy", FCFS)), False


def _priority_under_fcfs(
    c: _Checker, spec: Mapping[str, Any], cells: Sequence[tuple[str, Mapping[str, Any]]]
) -> None:
    """Rule 1: a class priority other than 0 needs every cell on the priority scheduler."""
    fcfs = []
    for path, cell in cells:
        if _has_errors(c, f"{path}.args.scheduling_policy"):
            continue  # a policy that is not one is reported where it is
        policy, explicit = _policy(cell)
        if policy == FCFS:
            how = "" if explicit else " by vLLM's default"
            fcfs.append(f"{_name(path, cell)} (scheduling_policy: fcfs{how})")
    if not fcfs:
        return
    for i, cls in enumerate(spec.get("classes") or []):
        priority = cls.get("priority") if isinstance(cls, Mapping) else None
        if isinstance(priority, int) and not isinstance(priority, bool) and priority != 0:
            many = len(fcfs) > 1
            c.fail(
                f"classes[{i}].priority",
                f"is {priority}, but cell{'s' if many else ''} {', '.join(fcfs)} "
                f"schedule{'' if many else 's'} first-come-first-served: vLLM refuses a request "
                "priority other than 0 without priority scheduling. Set scheduling_policy: priority "
                f"on {'those cells' if many else 'that cell'}, or give the class priority 0",
            )


def _shown(mapping: Mapping[str, Any], key: str) -> str:
    return repr(mapping[key]) if key in mapping else "unset"


def _differences(config: Mapping[str, Any], b0: Mapping[str, Any]) -> list[str]:
    """What a cell's effective config sets differently from B0's, in words."""
    out = []
    for part, prefix in (("args", ""), ("engine", "engine.")):
        mine, b0s = config[part], b0[part]
        for key in sorted(set(mine) | set(b0s)):
            if mine.get(key) != b0s.get(key):
                out.append(f"{prefix}{key} {_shown(mine, key)} (B0: {_shown(b0s, key)})")
    return out


def _same_effective_config(c: _Checker, cells: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Rule 2: no two cells run one config, unless one is an A/A control; a control is B0's
    config exactly."""
    checked = [(path, cell) for path, cell in cells if not _has_errors(c, path)]
    configs = {path: effective_config(cell.get("args") or {}, cell.get("engine")) for path, cell in checked}
    b0 = configs.get("baseline")
    for path, cell in checked:
        if path == "baseline" or not cell.get("control") or b0 is None:
            continue
        diffs = _differences(configs[path], b0)
        if diffs:
            c.fail(
                f"{path}.control",
                f"is true, but {_name(path, cell)} is not B0's configuration run again: "
                f"{'; '.join(diffs)}. An A/A control cell runs B0's effective config exactly",
            )
    seen: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for path, cell in checked:
        key = _key(configs[path])
        first = seen.get(key)
        if first is None:
            seen[key] = (path, cell)
            continue
        first_path, first_cell = first
        if cell.get("control") or first_cell.get("control"):
            continue
        if first_path == "baseline":
            message = (
                "runs the same effective config as B0 (after vLLM's defaults): the sweep would measure "
                "B0 twice. Mark it control: true if it is meant as an A/A cell (B0 run again, the "
                "measured noise floor), or change its args"
            )
        else:
            message = (
                f"runs the same effective config as {first_path} ({_name(first_path, first_cell)}) after "
                "vLLM's defaults: the sweep would measure one configuration twice. Change one of them"
            )
        c.fail(f"{path}.args", message)


def _budget_below_prompt(
    c: _Checker, spec: Mapping[str, Any], cells: Sequence[tuple[str, Mapping[str, Any]]]
) -> None:
    """Rule 3: with chunked prefill off, the budget holds the longest class's whole prompt."""
    prompts = [
        (int(cls["input_tokens"]), str(cls.get("name") or f"classes[{i}]"))
        for i, cls in enumerate(spec.get("classes") or [])
        if isinstance(cls, Mapping) and isinstance(cls.get("input_tokens"), int)
    ]
    if not prompts:
        return
    longest, name = max(prompts, key=lambda p: p[0])
    for path, cell in cells:
        args = cell.get("args") or {}
        budget = args.get("max_num_batched_tokens")
        where = f"{path}.args.max_num_batched_tokens"
        if args.get("enable_chunked_prefill") is not False or not isinstance(budget, int):
            continue
        if budget < longest and not _has_errors(c, where):
            c.fail(
                where,
                f"{budget} is below class {name}'s prompt ({longest} input tokens) with chunked prefill "
                f"off: no {name} request fits in one scheduler step. Raise it to at least {longest} or "
                "set enable_chunked_prefill: true",
            )
