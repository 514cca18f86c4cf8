"""Isolate sizes its pools: per class, the config, its capacity for that class alone, the class's
offered share, and the replicas its pool needs at the agreed rates with the spec's headroom. Pure.

An isolate decision says that no configuration keeps every class's contract on shared capacity,
so each class gets a pool of its own. How many servers each pool needs follows from what the
class offers, not from how many classes there are: seed 000's split gave the short class half
the servers while it sent 92% of the requests, and that pool ran out of headroom. Steps of
:func:`pool_sizing`:

1. The agreed points (:func:`agreed_points`): each agreed (mixture, rate) with its offered rate
   (the rate B0's sweep runs replayed) and each class's share there (the mixture's weight, by
   request count; B0's measured share of the cohort beside it). The class's offered rate is
   share x rate.
2. The pool's config (:func:`pool_config`): among the valid cells whose capacity for the class
   alone was measured, the one with the highest; where none was, the cell that served the class
   best on shared capacity (keeps its contract at every agreed point, then the lowest p99 of the
   class's primary metric, then plan order). A/A control cells are B0's config and never chosen.
3. Its capacity for the class alone: a capacity search on a mixture of that one class
   (report_inputs.ClassCapacity, found by apps/analysis/pool_capacity.class_capacities). Never
   estimated: where none ran, the pool says so and how to measure it, and its replicas are unknown.
4. Replicas (:func:`replicas_needed`): ceil(offered / (capacity x (1 - headroom))) at each agreed
   point; the pool needs the most over the points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from apps.analysis.family import primary_metrics
from apps.analysis.metrics import pvalue
from apps.analysis.pool_capacity import how_to_measure
from apps.analysis.report_inputs import CellInput, ClassCapacity, ClassInput
from apps.analysis.report_types import Aggregate, CellAcceptance, Pool, PoolPoint, PoolSizing

# Each replica is loaded to at most 80% of its measured capacity unless the spec says otherwise.
DEFAULT_HEADROOM = 0.2
# A ratio within this (relative) of a whole number is that number: 0.8 / 0.4 is 2 replicas, not 3.
_WHOLE = 1e-9
RULE = (
    "replicas = ceil(offered rate of the class / (its pool config's capacity for the class alone "
    "x (1 - headroom))), at each agreed point; a pool takes the most over the points"
)


class HeadroomError(ValueError):
    """``analysis.pool_headroom`` is not a share in [0, 1)."""

    field = "pool_headroom"


def checked_headroom(value: Any) -> float:
    """The spec's ``pool_headroom``: a number from 0 up to, not including, 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise HeadroomError(
            "pool_headroom must be a number from 0 up to, not including, 1 (the share of each "
            f"replica's measured capacity left unused), got {value!r:.40}"
        )
    return float(value)


class Replicas(NamedTuple):
    """What one pool needs at one point: ``servers`` None when it cannot be known (``why``)."""

    servers: int | None
    utilisation: float | None
    why: str


def replicas_needed(*, offered_rps: float, capacity_rps: float | None, headroom: float) -> Replicas:
    """The replicas that carry ``offered_rps`` with each at most (1 - headroom) of its capacity.

    1. No traffic: 0 replicas.
    2. No capacity (not measured, or no rate kept the contract): unknown, never guessed.
    3. Otherwise ceil(offered / (capacity x (1 - headroom))), at least 1; a ratio within 1e-9 of a
       whole number counts as that number (float division must not add a server).
    """
    headroom = checked_headroom(headroom)
    if isinstance(offered_rps, bool) or not math.isfinite(offered_rps) or offered_rps < 0:
        raise ValueError(f"offered_rps must be a finite number >= 0, got {offered_rps!r}")
    if offered_rps == 0:
        return Replicas(0, None, "the class offers no requests here")
    if capacity_rps is None:
        return Replicas(None, None, "its capacity for the class alone is not measured")
    if not math.isfinite(capacity_rps) or capacity_rps <= 0:
        return Replicas(None, None, "no measured rate kept the class's contract on this config")
    ratio = offered_rps / (capacity_rps * (1.0 - headroom))
    whole = round(ratio)
    count = int(whole) if abs(ratio - whole) <= _WHOLE * max(1.0, ratio) else math.ceil(ratio)
    count = max(1, count)
    return Replicas(count, round(offered_rps / (count * capacity_rps), 6), "")


# -- 1. the agreed points ----------------------------------------------------------------------


class AgreedPoint(NamedTuple):
    mixture: str
    rate: str
    rate_rps: float | None
    weights: Mapping[str, float]


def agreed_points(
    *,
    agreed: Sequence[tuple[str, str, int]],
    mixtures: Mapping[str, Mapping[str, float]],
    runs: Sequence[Mapping[str, Any]],
    rates: Mapping[str, Any],
    baseline: str,
) -> list[AgreedPoint]:
    """Each agreed (mixture, rate) once, with the rate B0's sweep runs replayed there (else any
    cell's, else the spec's number) and the mixture's class weights."""
    replayed: dict[tuple[str, str], float] = {}
    for r in sorted(runs, key=lambda r: r["cell"] != baseline):  # B0's runs first
        if not r.get("scenario") and isinstance(r.get("rate_rps"), (int, float)):
            replayed.setdefault((r["mixture"], r["rate"]), float(r["rate_rps"]))
    out = []
    for mix, rate in sorted({(m, r) for m, r, _ in agreed}):
        typed = rates.get(rate)
        rps = replayed.get((mix, rate), float(typed) if isinstance(typed, (int, float)) else None)
        out.append(AgreedPoint(mix, rate, rps, dict(mixtures.get(mix) or {})))
    return out


# -- 2. the pool's config ------------------------------------------------------------------------


def _primary_p99(aggregate: Mapping[str, Any], primary: str) -> float:
    """The class's primary metric at p99 (inf when censored or absent): the ranking's measure."""
    kind = primary.split("_p", 1)[0]  # ttft, e2e or max_stall
    block = (aggregate["pooled"].get(f"{kind}_ms") or {}).get("p99")
    return pvalue(block) if block else math.inf


def _kept(acceptance: CellAcceptance | None, name: str) -> bool:
    """The cell kept the class's contract at every agreed point (and had a run at each)."""
    if acceptance is None or not acceptance["checked"]:
        return False
    return not any(f.get("class") in (name, None) for f in acceptance["failures"])


def _usable(cap: ClassCapacity | None) -> bool:
    """A done search that found a positive capacity."""
    return (
        cap is not None
        and cap["status"] == "done"
        and cap["capacity_rps"] is not None
        and cap["capacity_rps"] > 0
    )


class Config(NamedTuple):
    cell: str | None
    chosen_by: str
    kept_contract_shared: bool | None
    sweep_best: str | None


def _sweep_best(
    name: str,
    *,
    cells: Sequence[str],
    primary: str,
    aggregates: Mapping[tuple[str, str, str, str], Mapping[str, Any]],
    acceptance: Mapping[str, CellAcceptance],
    served: Sequence[tuple[str, str]],
) -> tuple[str | None, bool | None, float]:
    """The cell that served the class best on shared capacity: (cell, kept its contract, worst p99)."""
    ranked = []
    for pos, cell in enumerate(cells):
        found = [aggregates.get((cell, m, r, name)) for m, r in served]
        if not served or any(a is None for a in found):
            continue  # no pooled runs of the class at some agreed point: not judged
        worst = max(_primary_p99(a, primary) for a in found if a is not None)
        kept = _kept(acceptance.get(cell), name)
        ranked.append((not kept, worst, pos, cell))
    if not ranked:
        return None, None, math.inf
    miss, worst, _, cell = min(ranked)
    return cell, not miss, worst


def pool_config(
    name: str,
    *,
    cells: Sequence[str],
    primary: str,
    aggregates: Mapping[tuple[str, str, str, str], Mapping[str, Any]],
    acceptance: Mapping[str, CellAcceptance],
    served: Sequence[tuple[str, str]],
    capacities: Mapping[str, ClassCapacity],
) -> Config:
    """Step 2 for one class. ``cells``: the valid cells that may be a pool's config, in plan
    order; ``served``: the agreed (mixture, rate) where the class has traffic; ``capacities``:
    cell -> its measured capacity for the class alone."""
    best, kept, worst = _sweep_best(
        name, cells=cells, primary=primary, aggregates=aggregates, acceptance=acceptance, served=served
    )
    measured = [
        (-float(cap["capacity_rps"] or 0), pos, cell)
        for pos, cell in enumerate(cells)
        if _usable(cap := capacities.get(cell)) and cap is not None
    ]
    if measured:
        _, _, cell = min(measured)
        listed = ", ".join(f"{c} {-neg:g} req/s" for neg, _, c in sorted(measured, key=lambda m: m[1]))
        return Config(
            cell,
            f"the highest capacity for {name} alone among the cells measured ({listed})",
            _kept(acceptance.get(cell), name) if served else None,
            best,
        )
    if not served:
        return Config(None, f"{name} offers no requests at the agreed points: it needs no pool", None, None)
    if best is None:
        return Config(None, f"no valid cell has pooled runs of {name} at every agreed point", None, None)
    level = "censored" if not math.isfinite(worst) else f"{worst:,.0f} ms"
    if kept:
        why = (
            f"it kept {name}'s contract at every agreed point on shared capacity with the lowest "
            f"{primary} there (worst over the points: {level})"
        )
    else:
        why = (
            f"no cell kept {name}'s contract on shared capacity; it came closest on {primary} "
            f"(worst over the points: {level}); only its capacity for {name} alone shows whether it "
            "keeps the contract without the other classes"
        )
    return Config(best, why, kept, best)


# -- 4. the pools ----------------------------------------------------------------------------------


def _measured_share(
    aggregates: Mapping[tuple[str, str, str, str], Mapping[str, Any]],
    baseline: str,
    point: AgreedPoint,
    names: Sequence[str],
    name: str,
) -> float | None:
    offered = {
        n: int(a["pooled"]["counts"]["offered"])
        for n in names
        if (a := aggregates.get((baseline, point.mixture, point.rate, n))) is not None
    }
    total = sum(offered.values())
    return round(offered.get(name, 0) / total, 6) if total else None


def _pool(
    c: ClassInput,
    config: Config,
    *,
    points: Sequence[AgreedPoint],
    capacity: ClassCapacity | None,
    headroom: float,
    gpus_per_server: int,
    aggregates: Mapping[tuple[str, str, str, str], Mapping[str, Any]],
    baseline: str,
    names: Sequence[str],
    args: Mapping[str, Any],
    experiment_id: Any,
    sweep_best_measured: bool,
) -> Pool:
    name = str(c["name"])
    cap_rps = capacity["capacity_rps"] if capacity and capacity["status"] == "done" else None
    rows: list[PoolPoint] = []
    whys: set[str] = set()
    for p in points:
        share = float(p.weights.get(name, 0.0) or 0.0)
        offered = round(share * p.rate_rps, 6) if p.rate_rps is not None else None
        need = (
            replicas_needed(offered_rps=offered, capacity_rps=cap_rps, headroom=headroom)
            if offered is not None
            else Replicas(None, None, "the agreed point's rate is not known")
        )
        if need.why and need.servers != 0:
            whys.add(need.why)
        rows.append(
            {
                "mixture": p.mixture,
                "rate": p.rate,
                "rate_rps": p.rate_rps,
                "share": share,
                "measured_share": _measured_share(aggregates, baseline, p, names, name),
                "offered_rps": offered,
                "replicas": need.servers,
                "utilisation": need.utilisation,
            }
        )
    counts = [r["replicas"] for r in rows]
    if counts and all(n == 0 for n in counts):
        replicas: int | None = 0  # no traffic at any agreed point: no pool, whatever its config
    elif not counts or config.cell is None or any(n is None for n in counts):
        replicas = None
    else:
        replicas = max(n for n in counts if n is not None)
    sized_at = None
    if replicas is not None and rows:
        top = next(r for r in rows if r["replicas"] == replicas)
        sized_at = [top["mixture"], top["rate"]]
    notes = sorted(whys)
    if capacity and capacity["status"] == "done" and capacity["bracketed"] is False and cap_rps:
        notes.append("no probed rate failed, so the capacity is a lower bound and the replicas an upper one")
    if capacity and capacity["status"] != "done":
        notes.append(
            f"its capacity search is {capacity['status']}: {capacity.get('reason') or 'no reason kept'}"
        )
    if capacity and capacity["status"] == "done" and cap_rps is None:
        low = capacity.get("lowest_rate_rps")
        notes.append(
            f"no probed rate kept {name}'s contract on {config.cell} alone"
            + (f" (lowest tried {low:g} req/s)" if low is not None else "")
            + ": lower the search's start_rps, or this config cannot serve the class within its contract"
        )
    if config.sweep_best and config.cell != config.sweep_best:
        notes.append(
            f"{config.sweep_best} served {name} best on shared capacity, "
            + (
                f"but {config.cell} measured the higher capacity for {name} alone"
                if sweep_best_measured
                else f"and its capacity for {name} alone is not measured: measured, it may need fewer replicas"
            )
        )
    measured = cap_rps is not None
    return {
        "class": name,
        "cell": config.cell,
        "args": dict(args),
        "chosen_by": config.chosen_by,
        "kept_contract_shared": config.kept_contract_shared,
        "sweep_best": config.sweep_best,
        "capacity": dict(capacity) if capacity else None,
        "capacity_rps": cap_rps,
        "how_to_measure": None
        if measured or config.cell is None
        else how_to_measure(experiment_id=experiment_id, cell=config.cell, name=name),
        "points": rows,
        "replicas": replicas,
        "gpus": replicas * gpus_per_server if replicas is not None else None,
        "sized_at": sized_at,
        "note": "; ".join(notes),
    }


def pool_sizing(
    *,
    experiment: Mapping[str, Any],
    cells: Sequence[CellInput],
    classes: Sequence[ClassInput],
    baseline: str,
    agreed: Sequence[tuple[str, str, int]],
    runs: Sequence[Mapping[str, Any]],
    aggregates: Sequence[Aggregate],
    acceptance: Mapping[str, CellAcceptance],
    invalid_cells: Sequence[str],
    capacities: Mapping[str, Mapping[str, ClassCapacity]] | None,
    headroom: float,
) -> PoolSizing:
    """Steps 1-4 of the module docstring, for every class."""
    headroom = checked_headroom(headroom)
    points = agreed_points(
        agreed=agreed,
        mixtures=experiment.get("mixtures") or {},
        runs=runs,
        rates=experiment.get("rates") or {},
        baseline=baseline,
    )
    by_key = {(a["cell"], a["mixture"], a["rate"], a["class"]): a for a in aggregates}
    invalid = set(invalid_cells)
    usable = [
        c["cell_id"]
        for c in cells
        if c["cell_id"] not in invalid and (c["cell_id"] == baseline or not c.get("control"))
    ]
    args_of = {c["cell_id"]: c.get("args") or {} for c in cells}
    primary = primary_metrics(classes)
    names = [str(c["name"]) for c in classes]
    gpus = int(experiment.get("tensor_parallel_size") or 1)
    pools: list[Pool] = []
    for c in classes:
        name = str(c["name"])
        per_cell = {cell: per[name] for cell, per in (capacities or {}).items() if name in per}
        served = [(p.mixture, p.rate) for p in points if float(p.weights.get(name, 0) or 0) > 0]
        config = pool_config(
            name,
            cells=usable,
            primary=primary[name],
            aggregates=by_key,
            acceptance=acceptance,
            served=served,
            capacities=per_cell,
        )
        pools.append(
            _pool(
                c,
                config,
                points=points,
                capacity=per_cell.get(config.cell) if config.cell else None,
                headroom=headroom,
                gpus_per_server=gpus,
                aggregates=by_key,
                baseline=baseline,
                names=names,
                args=args_of.get(config.cell or "", {}),
                experiment_id=experiment.get("id"),
                sweep_best_measured=_usable(per_cell.get(config.sweep_best or "")),
            )
        )
    unsized = [p["class"] for p in pools if p["replicas"] is None]
    total = None if unsized else sum(int(p["replicas"] or 0) for p in pools)
    return {
        "headroom": headroom,
        "rule": RULE,
        "pools": pools,
        "total_replicas": total,
        "unsized": unsized,
        "statement": _statement(pools, total=total, headroom=headroom),
    }


def _statement(pools: Sequence[Pool], *, total: int | None, headroom: float) -> str:
    """One line per the whole sizing: each pool's replicas, or what is missing."""
    parts = []
    for p in pools:
        if p["replicas"] == 0:
            parts.append(f"{p['class']}: no pool (no requests at the agreed points)")
        elif p["replicas"] is not None:
            share = max((pt["share"] for pt in p["points"]), default=0.0)
            parts.append(f"{p['class']}: {p['replicas']} x {p['cell']} ({share:.0%} of the requests)")
        else:
            why = "capacity not measured" if p["how_to_measure"] else "see its note"
            parts.append(f"{p['class']}: {p['cell'] or 'no config'}, replicas unknown ({why})")
    head = f"pools at the agreed rates with {headroom:.0%} headroom: " + "; ".join(parts)
    return head + (f"; {total} servers in all" if total is not None else "")
