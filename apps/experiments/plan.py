"""Expand an experiment's grid into its run plan.

Pure: no Django. The plan is cells x mixtures x rates x repeats. Each repeat
is a round that holds every (cell, mixture, rate) once, in its own random
order drawn from the experiment's seed, so slow drift of a host (thermal,
neighbours) spreads over all cells instead of biasing whichever runs last.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedRun:
    cell_id: str
    mixture: str
    rate_name: str
    repeat: int  # 1-based
    round_position: int  # 0-based position inside its round
    plan_position: int  # 0-based position in the whole plan


def round_seed(seed: int, repeat: int) -> int:
    """A stable per-round seed: the same on every machine and Python version."""
    digest = hashlib.sha256(f"tailtune-plan:{seed}:{repeat}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def expand_plan(
    *,
    cell_ids: list[str],
    mixtures: list[str],
    rates: list[str],
    repeats: int,
    seed: int,
    group_by_cell: bool = False,
) -> list[PlannedRun]:
    """Steps: 1. list every (cell, mixture, rate): cells in declared order, mixture
       and rate names sorted (Postgres jsonb does not keep key order, and the
       plan must not depend on how a database stored a mapping);
    2. for each repeat, shuffle a copy with that round's seed; with ``group_by_cell``
       (engine reuse: one server per cell and round) shuffle the order of the cells,
       then each cell's (mixture, rate) order, so a cell's runs of the round are
       consecutive and the cells still take a new random order every round;
    3. number the runs inside the round and across the plan."""
    combos = [(c, m, r) for m in sorted(mixtures) for r in sorted(rates) for c in cell_ids]
    plan: list[PlannedRun] = []
    for repeat in range(1, repeats + 1):
        rng = random.Random(round_seed(seed, repeat))
        if group_by_cell:
            cells = list(cell_ids)
            rng.shuffle(cells)
            order = []
            for cell in cells:
                mine = [x for x in combos if x[0] == cell]
                rng.shuffle(mine)
                order += mine
        else:
            order = list(combos)
            rng.shuffle(order)
        for pos, (cell, mixture, rate) in enumerate(order):
            plan.append(PlannedRun(cell, mixture, rate, repeat, pos, len(plan)))
    return plan
