"""A search's next step, from its spec and its recorded trials alone. Pure.

The lifecycle (apps/lifecycle/search_steps.py) asks ``next_step`` at the start and each time a
screening run ends:
screen another trial (the params to record as a running SearchTrial and the cell args its run
serves), wait for the trials still running, or confirm: the best k as candidate cells with B0's
other flags, ready to be planned like a grid's candidates in fresh rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.search.objective import Trial, best_k, stop_reason
from apps.search.study import propose, server_args

SCREEN, WAIT, CONFIRM = "screen", "wait", "confirm"


@dataclass(frozen=True)
class Step:
    action: str  # SCREEN, WAIT or CONFIRM
    params: dict[str, Any] = field(default_factory=dict)  # SCREEN: the trial's params
    args: dict[str, Any] = field(default_factory=dict)  # SCREEN: its server's cell args
    cells: list[dict[str, Any]] = field(default_factory=list)  # CONFIRM: [{id, args, trial}]
    why: str = ""  # CONFIRM: why the screening stopped


def next_step(
    search: Mapping[str, Any],
    trials: Sequence[Trial],
    *,
    pending: Sequence[Mapping[str, Any]] = (),
    baseline_args: Mapping[str, Any],
    max_model_len: int | None,
    seed: int,
    concurrency: int = 1,
) -> Step:
    """What to do now. ``trials``: the finished ones; ``pending``: the params of trials still
    running; ``concurrency``: how many trials may run at once (one per host pulling them)."""
    budget = search["budget"]
    # Running trials count against the trial budget: they will finish.
    counted = [*trials, *(Trial(-1, p, "running") for p in pending)]
    why = stop_reason(
        counted,
        max_trials=int(budget["max_trials"]),
        max_engine_hours=budget.get("max_engine_hours"),
        patience=budget.get("patience"),
    )
    if why is None and len(pending) < concurrency:
        params = propose(
            search["space"],
            trials,
            baseline_args=baseline_args,
            max_model_len=max_model_len,
            seed=seed,
            pending=pending,
        )
        if params is not None:
            return Step(
                SCREEN,
                params=params,
                args=server_args(params, baseline_args=baseline_args, max_model_len=max_model_len),
            )
        why = "every config of the space screened"
    if pending:
        return Step(WAIT)
    chosen = best_k(trials, int(search["confirm"]))
    cells = [
        {
            "id": f"T{t.number}",
            "args": server_args(t.params, baseline_args=baseline_args, max_model_len=max_model_len),
            "trial": t.number,
        }
        for t in chosen
    ]
    return Step(CONFIRM, cells=cells, why=why or "")
