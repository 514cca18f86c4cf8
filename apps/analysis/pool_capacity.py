"""Where an isolate decision's pool capacities come from: each cell's measured capacity for one
class alone, read from the capacity searches a workload stored (``Workload.rates_derivation``,
written by apps/lifecycle/calibration.py), and the manual step that measures one where none ran.
Pure: apps/analysis/pool_sizing.py sizes the pools from what this finds, and never estimates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apps.analysis.report_inputs import ClassCapacity

# The derivation's sections (apps/runs/selectors.GOODPUT and CLASS_CAPACITY, which this pure
# module cannot import): cell -> class -> search, and cell -> mixture -> search.
CLASS_CAPACITY, GOODPUT = "class_capacity", "goodput_capacity"


def _only_class(weights: Mapping[str, Any]) -> str | None:
    """The one class a mixture holds (every other weight 0), or None."""
    present = [c for c, w in weights.items() if isinstance(w, (int, float)) and w > 0]
    return present[0] if len(present) == 1 else None


def _entry(search: Mapping[str, Any], source: str) -> ClassCapacity:
    steps = list(search.get("steps") or [])
    cap = search.get("capacity_rps")
    entry: ClassCapacity = {
        "status": str(search.get("status") or "done"),
        "capacity_rps": float(cap) if isinstance(cap, (int, float)) else None,
        "bracketed": search.get("bracketed"),
        "steps": len(steps),
        "source": source,
    }
    rates = [float(st["rate_rps"]) for st in steps if isinstance(st.get("rate_rps"), (int, float))]
    if rates:
        entry["lowest_rate_rps"] = min(rates)
    if search.get("reason"):
        entry["reason"] = str(search["reason"])[:500]
    return entry


def class_capacities(
    derivation: Mapping[str, Any], *, mixtures: Mapping[str, Mapping[str, Any]], baseline: str
) -> dict[str, dict[str, ClassCapacity]]:
    """cell -> class -> its capacity for the class alone, from a workload's ``rates_derivation``.

    Three searches measure it, preferred in this order (a done one over any other status):
    ``class_capacity`` (a capacity search on a mixture of the one class), a ``goodput_capacity``
    search on a spec mixture that holds only that class, and B0's own capacity probe (``probes``)
    on such a mixture.
    """
    found: dict[tuple[str, str], list[ClassCapacity]] = {}
    for cell, per in sorted((derivation.get(CLASS_CAPACITY) or {}).items()):
        for name, search in sorted((per or {}).items()):
            if isinstance(search, Mapping):
                source = f"capacity search of {cell} on {name} alone"
                found.setdefault((cell, name), []).append(_entry(search, source))
    for cell, per in sorted((derivation.get(GOODPUT) or {}).items()):
        for mix, search in sorted((per or {}).items()):
            name = _only_class(mixtures.get(mix) or {})
            if name is not None and isinstance(search, Mapping):
                source = f"goodput search of {cell} on mixture {mix} ({name} alone)"
                found.setdefault((cell, name), []).append(_entry(search, source))
    for probe in derivation.get("probes") or []:
        name = _only_class(mixtures.get(probe.get("mixture")) or {})
        if name is not None:
            source = f"B0's capacity probe on mixture {probe['mixture']} ({name} alone)"
            found.setdefault((baseline, name), []).append(_entry({**probe, "status": "done"}, source))
    out: dict[str, dict[str, ClassCapacity]] = {}
    for (cell, name), entries in sorted(found.items()):
        done = [e for e in entries if e["status"] == "done"]
        out.setdefault(cell, {})[name] = (done or entries)[0]
    return out


def how_to_measure(*, experiment_id: Any, cell: str, name: str) -> str:
    """The manual step that measures a pool's capacity (the report never guesses one)."""
    ident = experiment_id if experiment_id is not None else "ID"
    return (
        f"not measured: run `python manage.py experiment_calibrate {ident} --cell {cell} --class {name}` "
        "on a host (or the experiment page's \"Measure a class's capacity alone\" form) while the "
        "experiment is planned, running or cancelled, and the analysis reads it (`experiment_report "
        f"{ident} --save` analyses again). An analysed experiment takes no more runs: measure it in a "
        f"follow-up experiment whose B0 runs {cell}'s args and whose one mixture is {name} alone, with a "
        "calibration block; its probe's capacity is this number"
    )
