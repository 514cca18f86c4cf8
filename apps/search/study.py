"""The optimiser behind a search: Optuna's TPE, its study rebuilt in memory from the recorded trials.

Pure: no Django. The database's trial rows are the source of truth, not an Optuna storage: each
proposal rebuilds an in-memory study from them (``Trial`` values, apps/search/objective.py) and
asks it for the next config, so a worker restart loses nothing and several hosts can pull trials
at once (a trial still running is told to the sampler as running, and TPE's constant liar keeps
a second host from being handed the same region). The rebuild costs milliseconds for the few
hundred trials a budget allows.

Every knob keeps one distribution (TPE then models them jointly); vLLM's rules
(apps/experiments/spec_search.py) turn a trial's params into the server's args (``server_args``):
with chunked prefill off, the token budget is raised to ``max_model_len`` and the chunked-only
knobs stay at B0's, so every screened config is one vLLM accepts, and two params that give the
same args are one config (never screened twice).

Optuna is imported inside the functions: a web process that never proposes a trial never pays
for the import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from apps.experiments.spec_search import BUDGET, CHUNKED, CHUNKED_ONLY
from apps.search.objective import FAILED, Trial

if TYPE_CHECKING:
    import optuna

# Fresh draws before TPE models the surface (Optuna's default is 10); a search budget is small.
STARTUP_TRIALS = 8
# How often a proposal that repeats a recorded config is asked again before giving up.
MAX_REDRAWS = 50


def _quiet() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _order(space: Mapping[str, Any]) -> list[str]:
    """Chunked prefill first: the other knobs' ranges depend on it."""
    return sorted(space, key=lambda k: (k != CHUNKED, k))


def distributions(space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The Optuna distribution of each knob: the same for every trial, so TPE models the knobs
    jointly (a distribution that changed with chunked prefill would drop the knob from the joint
    model); vLLM's rules are applied afterwards, by ``server_args``."""
    optuna = _quiet()
    out: dict[str, Any] = {}
    for knob in _order(space):
        entry = space[knob]
        if "values" in entry:
            out[knob] = optuna.distributions.CategoricalDistribution(list(entry["values"]))
        else:
            out[knob] = optuna.distributions.IntDistribution(
                int(entry["min"]), int(entry["max"]), log=bool(entry.get("log"))
            )
    return out


def server_args(
    params: Mapping[str, Any], *, baseline_args: Mapping[str, Any], max_model_len: int | None
) -> dict[str, Any]:
    """The cell args a trial's params give, by vLLM's rules: B0's args with the params over them;
    with chunked prefill off, the token budget raised to ``max_model_len`` (a whole prompt in one
    step) and the chunked-only knobs left at B0's (apps/experiments/spec_search.py)."""
    args = {**baseline_args, **params}
    if args.get(CHUNKED) is False:
        for knob in CHUNKED_ONLY:
            if knob in params:
                if knob in baseline_args:
                    args[knob] = baseline_args[knob]
                else:
                    args.pop(knob, None)
        budget = args.get(BUDGET)
        if max_model_len is not None and isinstance(budget, int) and budget < max_model_len:
            args[BUDGET] = int(max_model_len)
    return args


def _suggest(trial: optuna.trial.Trial, space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {knob: trial._suggest(knob, dist) for knob, dist in distributions(space).items()}


def _seed(seed: int, count: int, redraw: int) -> int:
    """A sampler seed per proposal: the rebuilt study replays nothing, so a fixed seed would draw
    the same startup config every time."""
    digest = hashlib.sha256(f"{seed}:{count}:{redraw}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def rebuild(
    space: Mapping[str, Mapping[str, Any]],
    trials: Sequence[Trial],
    *,
    seed: int,
    pending: Sequence[Mapping[str, Any]] = (),
    redraw: int = 0,
) -> optuna.Study:
    """An in-memory study holding the recorded trials (scores: Trial.score) and the pending ones."""
    optuna = _quiet()
    sampler = optuna.samplers.TPESampler(
        seed=_seed(seed, len(trials) + len(pending), redraw),
        n_startup_trials=STARTUP_TRIALS,
        constant_liar=True,
        multivariate=True,
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    states = optuna.trial.TrialState
    dists = distributions(space)
    for t in sorted(trials, key=lambda t: t.number):
        study.add_trial(_recorded(optuna, dists, t.params, state=states.COMPLETE, value=t.score))
    for p in pending:
        study.add_trial(_recorded(optuna, dists, p, state=states.RUNNING, value=None))
    return study


def _recorded(
    optuna: Any, dists: Mapping[str, Any], params: Mapping[str, Any], *, state: Any, value: float | None
) -> Any:
    """A recorded trial as Optuna's FrozenTrial; a knob the space no longer holds (or a value
    outside it) is left out of the model, not an error."""
    kept = {
        k: v for k, v in params.items() if k in dists and dists[k]._contains(dists[k].to_internal_repr(v))
    }
    return optuna.trial.create_trial(
        params=kept, distributions={k: dists[k] for k in kept}, value=value, state=state
    )


def propose(
    space: Mapping[str, Mapping[str, Any]],
    trials: Sequence[Trial],
    *,
    baseline_args: Mapping[str, Any],
    max_model_len: int | None,
    seed: int,
    pending: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any] | None:
    """The next trial's params (the searched knobs), whose ``server_args`` no recorded or running
    trial has; None when every draw repeats one (a small space used up)."""

    def key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        return _key(server_args(params, baseline_args=baseline_args, max_model_len=max_model_len))

    seen = {key(t.params) for t in trials} | {key(p) for p in pending}
    study = rebuild(space, trials, seed=seed, pending=pending)
    optuna = _quiet()
    for _ in range(MAX_REDRAWS):
        trial = study.ask()
        params = _suggest(trial, space)
        if key(params) not in seen:
            return params
        # Told as failed, the repeat leaves the model as it was; the sampler's state moves on.
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    # TPE keeps to a region it has screened: a uniform draw explores instead of stopping early.
    rng = optuna.samplers.RandomSampler(seed=_seed(seed, len(trials) + len(pending), MAX_REDRAWS))
    explore = optuna.create_study(direction="maximize", sampler=rng)
    for _ in range(MAX_REDRAWS):
        params = _suggest(explore.ask(), space)
        if key(params) not in seen:
            return params
    return None


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def importances(space: Mapping[str, Mapping[str, Any]], trials: Sequence[Trial]) -> dict[str, float]:
    """Which knobs mattered: Optuna's default importance evaluator (its own fANOVA, no
    scikit-learn) over the measured trials; {} until there are enough to say."""
    measured = [t for t in trials if t.outcome != FAILED]
    if len(measured) < 3:
        return {}
    study = rebuild(space, trials, seed=0)
    optuna = _quiet()
    try:
        found = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):  # too few trials, or a knob that never varied
        return {}
    return {k: round(float(v), 4) for k, v in found.items()}
