"""The run record's field names: the method's, and the older names kept as aliases. Pure: no Django.

The method (issue #2's run record, the seed's schema) names a run's fields ``run_id``,
``cell_id``, ``mixture``, ``rate``, ``repeat``, ``position``, ``trace_sha256``,
``corpus_sha256``, ``image_digest``, ``model_revision``, ``tokenizer_revision``, ``hardware_id``,
``effective_args``, ``warmup_seconds``, ``observation_seconds``, ``drain_deadline_seconds``,
``status`` and ``reason``, with the host and timestamps. Every export of a run record uses these
names (the report's ``runs[]``, ``GET /api/v1/runs/<uuid>``, the run page's ``run.json``), so a
consumer written to the method's schema reads any of them.

Before, the record said ``cell`` for ``cell_id`` and nested the windows as
``window: {warmup_s, observation_s, drain_deadline_s}``. Both stay in every export as documented
aliases (docs/SPEC.md, "The run record"): the report's own readers and pages, reports stored
before the change, and consumers written against the older export read them. ``results_import``
reads a ``run.json`` in either naming (``resolve_aliases``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# What identifies a run and what it ran under, in the method's names, in every export's order
# (docs/SPEC.md "The run record" documents exactly these).
RUN_RECORD_FIELDS: tuple[str, ...] = (
    "run_id",
    "cell_id",
    "mixture",
    "rate",
    "rate_rps",
    "repeat",
    "position",
    "scenario",
    "status",
    "trace_sha256",
    "corpus_sha256",
    "image_digest",
    "vllm_version",
    "model_revision",
    "tokenizer_revision",
    "hardware_id",
    "effective_args",
    "generation",
    "dispatch_lag_p99_ms",
    "warmup_seconds",
    "observation_seconds",
    "drain_deadline_seconds",
)
# The older names: ``cell``, and the ``window`` object's keys -> the method's names.
CELL_ALIAS = "cell"
WINDOW_ALIAS = "window"
WINDOW_NAMES: Mapping[str, str] = {
    "warmup_s": "warmup_seconds",
    "observation_s": "observation_seconds",
    "drain_deadline_s": "drain_deadline_seconds",
}
ALIASES: tuple[str, ...] = (CELL_ALIAS, WINDOW_ALIAS)


def windows(warmup: float, observation: float, drain_deadline: float) -> dict[str, float]:
    """A run's windows under the method's names."""
    return {
        "warmup_seconds": warmup,
        "observation_seconds": observation,
        "drain_deadline_seconds": drain_deadline,
    }


def aliases(record: Mapping[str, Any]) -> dict[str, Any]:
    """The older names of a record that has the method's: ``cell`` and ``window``."""
    return {
        CELL_ALIAS: record["cell_id"],
        WINDOW_ALIAS: {old: record[new] for old, new in WINDOW_NAMES.items()},
    }


class AliasConflict(ValueError):
    """A record gives a field under both names, with two values; ``field`` is the method's name."""

    def __init__(self, field: str, alias: str) -> None:
        self.field = field
        self.alias = alias
        super().__init__(f"field {field} and its older name {alias} disagree")


def resolve_aliases(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with the older names mapped to the method's (the aliases dropped).

    A field given under both names must have one value (AliasConflict otherwise); a ``window``
    that is not an object, or holds another key, is left in place for the caller's type check
    to name."""
    out = {k: v for k, v in obj.items() if k not in ALIASES}
    pairs: list[tuple[str, str, Any]] = []
    if CELL_ALIAS in obj:
        pairs.append(("cell_id", CELL_ALIAS, obj[CELL_ALIAS]))
    window = obj.get(WINDOW_ALIAS)
    if WINDOW_ALIAS in obj:
        if not isinstance(window, Mapping) or set(window) - set(WINDOW_NAMES):
            out[WINDOW_ALIAS] = window
        else:
            pairs.extend((WINDOW_NAMES[k], f"{WINDOW_ALIAS}.{k}", v) for k, v in window.items())
    for field, alias, value in pairs:
        if field in out and out[field] != value:
            raise AliasConflict(field, alias)
        out[field] = value
    return out
