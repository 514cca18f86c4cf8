"""The spec's ``search`` section: a space of scheduler configs to screen instead of a grid of cells.

Pure: no Django. A spec has a grid (``candidates``) or a search, not both. The space names each
knob (a cell arg of spec_rules.CELL_ARGS) as a set of values or an integer range (``log: true``
samples it on a log scale, as suits the token budget); vLLM's own rules between knobs are checked
here, so the optimiser never proposes a config the server refuses:

- with chunked prefill off, the token budget must hold a whole prompt (``max_model_len``);
- ``long_prefill_token_threshold`` only means something with chunked prefill on.

Where chunked prefill is itself searched, these bind only the configs that turn it off (the
space is conditional: apps/search/space.py). The budget caps trials, engine-hours and trials
without improvement; the screening point (a mixture and a rate) defaults to the hardest agreed
point: the heaviest mixture (most tokens per request) at the highest rate. docs/SPEC.md, "search".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from apps.experiments.spec_checker import _Checker
from apps.experiments.spec_rules import CELL_ARGS, MAX_TOKENS, SCHEDULING_POLICIES
from apps.experiments.spec_types import SearchKnob, SearchScreening, SearchSpec

# A search's trial cells are T0, T1, ... (apps/lifecycle/search_steps.py): B0 may not take such an id.
TRIAL_ID = re.compile(r"T[0-9]+")
SEARCH_KEYS = frozenset({"space", "budget", "screening", "confirm"})
BUDGET_KEYS = frozenset({"max_trials", "max_engine_hours", "patience"})
RANGE_KEYS = frozenset({"min", "max", "log"})
MAX_TRIALS = 500
MAX_SET_VALUES = 64
MAX_CONFIRM = 10
# The best k screened configs confirmed on fresh data. Three: one best guess is fragile against
# a lucky screening round (one round, one point), while each confirmed cell costs a whole paired
# design, and the Holm family grows with it (docs/SEARCH.md, "Why three").
DEFAULT_CONFIRM = 3
# The bench's budget (bench/results/search.md): 60 single-round trials cost about 3% of a 90-cell
# grid's engine time, and no patience by default: one round's margin is noisy, so a lucky early
# trial sets a bar that stops the search before it has found the region (12/20 seeds within 5%
# with a patience of 20, 18/20 without).
DEFAULT_MAX_TRIALS = 60
CHUNKED = "enable_chunked_prefill"
BUDGET = "max_num_batched_tokens"
# Knobs that only act with chunked prefill on.
CHUNKED_ONLY = ("long_prefill_token_threshold",)


def check_search(
    c: _Checker,
    raw: Any,
    *,
    baseline_args: Mapping[str, Any],
    max_model_len: int | None,
    mixtures: Mapping[str, Mapping[str, float]],
    rates: Mapping[str, float],
    class_tokens: Mapping[str, int],
) -> SearchSpec:
    """The ``search`` section, normalised (defaults filled in); problems go to ``c``.

    ``class_tokens``: each class's tokens per request (input + output), which ranks the mixtures.
    """
    data = c.mapping(raw, "search")
    c.unknown(data, SEARCH_KEYS, "search")
    space = _check_space(c, data.get("space"))
    _check_rules(c, space, baseline_args, max_model_len)
    budget = c.mapping(data.get("budget"), "search.budget", required=False)
    c.unknown(budget, BUDGET_KEYS, "search.budget")
    max_trials = c.number(
        budget,
        "max_trials",
        "search.budget",
        required=False,
        integer=True,
        minimum=1,
        maximum=MAX_TRIALS,
        default=DEFAULT_MAX_TRIALS,
    )
    confirm = c.number(
        data,
        "confirm",
        "search",
        required=False,
        integer=True,
        minimum=1,
        maximum=MAX_CONFIRM,
        default=DEFAULT_CONFIRM,
    )
    if isinstance(max_trials, int) and isinstance(confirm, int) and confirm > max_trials:
        c.fail(
            "search.confirm",
            f"{confirm} confirmed cells need at least as many trials (max_trials is {max_trials})",
        )
    points = grid_points(space)
    if points is not None and points < 2:
        c.fail(
            "search.space",
            "holds one config only: give a knob two values or more (or write it as a candidate)",
        )
    return {
        "space": space,
        "budget": {
            "max_trials": max_trials,
            "max_engine_hours": c.number(
                budget, "max_engine_hours", "search.budget", required=False, positive=True, maximum=1e6
            ),
            "patience": c.number(
                budget,
                "patience",
                "search.budget",
                required=False,
                integer=True,
                minimum=1,
                maximum=MAX_TRIALS,
            ),
        },
        "screening": _check_screening(c, data.get("screening"), mixtures, rates, class_tokens),
        "confirm": confirm,
    }


def search_as_written(search: SearchSpec) -> dict[str, Any]:
    """A normalised ``search`` section as a spec writes it, so an export validates back to the
    same section: each set as its list of values, unset budget keys left out, and a default
    screening point left out (it is drawn the same way again)."""
    budget = {k: v for k, v in search["budget"].items() if v is not None}
    out: dict[str, Any] = {
        "space": {
            knob: list(entry["values"]) if "values" in entry else dict(entry)
            for knob, entry in search["space"].items()
        },
        "budget": budget,
        "confirm": search["confirm"],
    }
    screening = search["screening"]
    if screening.get("chosen") == "given":
        out["screening"] = {"mixture": screening["mixture"], "rate": screening["rate"]}
    return out


def _check_space(c: _Checker, raw: Any) -> dict[str, SearchKnob]:
    space = c.mapping(raw, "search.space")
    if raw is not None and not space and isinstance(raw, Mapping):
        c.fail("search.space", "must name at least one knob")
    out: dict[str, SearchKnob] = {}
    for knob, spec in space.items():
        path = f"search.space.{knob}"
        if knob not in CELL_ARGS:
            c.fail(path, f"is not a knob a search varies; searchable: {', '.join(sorted(CELL_ARGS))}")
            continue
        kind = CELL_ARGS[knob]
        if isinstance(spec, list):
            values = _check_values(c, spec, path, knob, kind)
            if values:
                out[knob] = {"values": values}
        elif isinstance(spec, Mapping):
            if kind is not int:
                c.fail(path, "only an integer knob takes a range {min, max}; give a list of values")
                continue
            rng = c.mapping(spec, path)
            c.unknown(rng, RANGE_KEYS, path)
            low = c.number(rng, "min", path, integer=True, positive=True, maximum=MAX_TOKENS)
            high = c.number(rng, "max", path, integer=True, positive=True, maximum=MAX_TOKENS)
            log = c.boolean(rng, "log", path, default=False)
            if low is None or high is None:
                continue
            if low >= high:
                c.fail(f"{path}.max", f"must be above min ({low}), got {high}")
                continue
            out[knob] = {"min": low, "max": high, "log": log}
        else:
            c.fail(path, "must be a list of values or a range {min, max, log}")
    return out


def _check_values(c: _Checker, raw: list[Any], path: str, knob: str, kind: type) -> list[Any]:
    if not raw:
        c.fail(path, "must list at least one value")
        return []
    if len(raw) > MAX_SET_VALUES:
        c.fail(path, f"{len(raw)} values; at most {MAX_SET_VALUES} (an integer knob can be a range)")
        return []
    values: list[Any] = []
    for i, value in enumerate(raw):
        where = f"{path}[{i}]"
        if kind is bool:
            if not isinstance(value, bool):
                c.fail(where, f"must be true or false, got {value!r:.60}")
                continue
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TOKENS:
                c.fail(where, f"must be a whole number from 1 to {MAX_TOKENS}, got {value!r:.60}")
                continue
        elif knob == "scheduling_policy" and value not in SCHEDULING_POLICIES:
            c.fail(where, f"must be one of {', '.join(SCHEDULING_POLICIES)}, got {value!r:.60}")
            continue
        if value in values:
            c.fail(where, f"repeats the value {value!r}")
            continue
        values.append(value)
    return values


def _possible(
    space: Mapping[str, SearchKnob], baseline_args: Mapping[str, Any], knob: str, default: Any
) -> list[Any]:
    """The values a knob takes in the space's configs: its set, or B0's (or vLLM's default)."""
    entry = space.get(knob)
    if entry is not None and "values" in entry:
        return list(entry["values"])
    return [baseline_args.get(knob, default)]


def _check_rules(
    c: _Checker, space: Mapping[str, SearchKnob], baseline_args: Mapping[str, Any], max_model_len: int | None
) -> None:
    """vLLM's rules between knobs, for the configs with chunked prefill off (when the space has any)."""
    if CHUNKED in space or any(k in space for k in (BUDGET, *CHUNKED_ONLY)):
        chunked = _possible(space, baseline_args, CHUNKED, True)
    else:
        return
    if False not in chunked:
        return
    only_off = True not in chunked
    where = f"search.space.{CHUNKED}" if CHUNKED in space else f"baseline.args.{CHUNKED}"
    for knob in CHUNKED_ONLY:
        if knob in space and only_off:
            c.fail(
                f"search.space.{knob}",
                f"only acts with chunked prefill on, and every config has it off ({where})",
            )
    if max_model_len is None:
        return
    entry = space.get(BUDGET)
    if entry is None:
        budget = baseline_args.get(BUDGET)
        if isinstance(budget, int) and budget < max_model_len:
            c.fail(
                f"search.space.{CHUNKED}",
                f"configs with chunked prefill off need a token budget of at least controls.max_model_len "
                f"({max_model_len}); B0's is {budget}: search {BUDGET} too, or keep chunked prefill on",
            )
        return
    highest = entry["max"] if "max" in entry else max(entry["values"])
    lowest = entry["min"] if "min" in entry else min(entry["values"])
    if highest < max_model_len:
        c.fail(
            f"search.space.{BUDGET}",
            f"reaches {highest} at most, below controls.max_model_len ({max_model_len}): vLLM refuses every "
            "config with chunked prefill off; raise it or keep chunked prefill on",
        )
    elif only_off and lowest < max_model_len:
        c.fail(
            f"search.space.{BUDGET}",
            f"starts at {lowest}, below controls.max_model_len ({max_model_len}), and chunked prefill is off in "
            f"every config ({where}): vLLM refuses those; start at {max_model_len} or search chunked prefill too",
        )


def _check_screening(
    c: _Checker,
    raw: Any,
    mixtures: Mapping[str, Mapping[str, float]],
    rates: Mapping[str, float],
    class_tokens: Mapping[str, int],
) -> SearchScreening:
    data = c.mapping(raw, "search.screening", required=False)
    c.unknown(data, {"mixture", "rate"}, "search.screening")
    mixture = c.text(data, "mixture", "search.screening", required=False, max_length=200)
    rate = c.text(data, "rate", "search.screening", required=False, max_length=200)
    if mixture and mixture not in mixtures:
        c.fail("search.screening.mixture", f"names unknown mixture {mixture!r}")
    if rate and rate not in rates:
        c.fail("search.screening.rate", f"names unknown rate {rate!r}")
    chosen = "given" if mixture or rate else "default"
    if not mixture and mixtures:
        mixture = heaviest_mixture(mixtures, class_tokens)
    if not rate and rates:
        rate = max(sorted(rates), key=lambda name: rates[name] or 0.0)
    return {"mixture": mixture, "rate": rate, "chosen": chosen}


def heaviest_mixture(mixtures: Mapping[str, Mapping[str, float]], class_tokens: Mapping[str, int]) -> str:
    """The mixture with the most tokens per request (ties: the first name in sorted order)."""

    def weight(name: str) -> float:
        return sum(w * class_tokens.get(cls, 0) for cls, w in mixtures[name].items())

    return max(sorted(mixtures), key=weight)


def range_values(entry: Mapping[str, Any]) -> list[int]:
    """A range's grid: every integer, or for a log range min, 2 x min, 4 x min ... and max."""
    low, high = int(entry["min"]), int(entry["max"])
    if not entry.get("log"):
        return list(range(low, high + 1))
    out = []
    value = low
    while value < high:
        out.append(value)
        value *= 2
    return [*out, high]


def grid_points(space: Mapping[str, SearchKnob]) -> int | None:
    """How many configs the full grid of the space holds (a set's values, a range's
    ``range_values``), ignoring vLLM's rules between knobs. None: no space."""
    if not space:
        return None
    total = 1
    for entry in space.values():
        if "values" in entry:
            total *= len(entry["values"])
        elif entry.get("log"):
            total *= len(range_values(entry))
        else:
            total *= int(entry["max"]) - int(entry["min"]) + 1
    return total
