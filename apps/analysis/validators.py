"""A class's validators run on the probe's answers, each answer within a time budget. Pure.

The spec bounds what a validator may be (apps/experiments/schema_bounds.py: no ``$ref`` fan-out
or cycle, no reference outside the schema, a stated size; a regular expression of at most
2,000 characters), but an experiment stored before those bounds, a pattern that backtracks on
one unlucky answer, or thousands of answers can still cost more than an analysis should spend.
So every judgement here is charged to a :class:`ValidatorBudget`:

1. **Per answer** (``answer_s``): a regular expression is searched with the ``regex`` library's
   own ``timeout``; a JSON schema is validated by Draft 2020-12's validator whose every keyword
   first checks the deadline (``jsonschema.validators.extend``, the library's extension point),
   so the validator stops within one keyword's work of it. An answer past its deadline fails
   the validator with that reason.
2. **Per analysis of an experiment** (``experiment_s``): the time every answer took is added up;
   an answer's deadline is never later than what is left, and once nothing is left each later
   answer fails "not judged" with that reason. A worker is never held longer than this.
3. Nothing is fetched: the schema's registry is empty (``referencing.Registry()``, which
   retrieves nothing; only the bundled Draft 2020-12 metaschemas are known), so a ``$ref`` to a
   URL or a file fails the answer with that reason instead of being read.

This runs where the analysis runs: on a worker (``tailtune.analyse_experiment``) or in a
management command, never in a web request. The budgets are settings
(``TAILTUNE_VALIDATOR_ANSWER_MS``, ``TAILTUNE_VALIDATOR_EXPERIMENT_S``), passed in by the service.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import regex

REASON_CHARS = 200


@dataclass(frozen=True)
class ValidatorBudget:
    """How long validators may take: one answer, and all answers of one analysis together."""

    answer_s: float = 1.0
    experiment_s: float = 120.0
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)


class _OutOfTime(Exception):
    """Raised inside the schema validator when the answer's deadline has passed."""


def _seconds(value: float) -> str:
    return f"{value:g} s"


class Judge:
    """Judges answers against validators, charging each judgement to one budget.

    ``judge`` returns None when the answer passes, else the reason it fails (one line).
    """

    def __init__(self, budget: ValidatorBudget) -> None:
        self.budget = budget
        self.spent = 0.0
        self._deadline = float("inf")
        self._validators: dict[str, Any] = {}
        self._cls: Any = None

    # -- the budget -------------------------------------------------------------------------
    @property
    def left(self) -> float:
        return self.budget.experiment_s - self.spent

    def _over(self, limited_by_experiment: bool) -> str:
        if limited_by_experiment:
            return f"ran past the analysis's validator budget ({_seconds(self.budget.experiment_s)} an experiment)"
        return f"ran past its time budget ({_seconds(self.budget.answer_s)} an answer)"

    def judge(self, kind: str, rule: Any, answer: Mapping[str, Any]) -> str | None:
        if answer.get("error"):
            return f"no answer: {str(answer['error'])[:REASON_CHARS]}"
        if kind == "finish_reason":
            got = answer.get("finish_reason")
            return None if got == rule else f"finished with {got!r:.40}, not {rule!r}"
        if self.left <= 0:
            return (
                "not judged: the analysis spent its validator budget "
                f"({_seconds(self.budget.experiment_s)} an experiment)"
            )
        allowed = min(self.budget.answer_s, self.left)
        by_experiment = self.left < self.budget.answer_s
        text = str(answer.get("text") or "")
        start = self.budget.clock()
        try:
            if kind == "regex":
                return self._regex(rule, text, allowed, by_experiment)
            if kind == "json_schema":
                return self._json_schema(rule, text, start + allowed, by_experiment)
            raise ValueError(f"unknown validator {kind!r}")
        finally:
            self.spent += max(0.0, self.budget.clock() - start)

    # -- the validators ---------------------------------------------------------------------
    def _regex(self, rule: str, text: str, allowed: float, by_experiment: bool) -> str | None:
        try:
            found = regex.search(rule, text, timeout=allowed)
        except TimeoutError:
            return self._over(by_experiment)
        except regex.error as exc:
            return f"not a regular expression: {exc}"[:REASON_CHARS]
        return None if found is not None else "no match for the regular expression"

    def _json_schema(self, rule: Any, text: str, deadline: float, by_experiment: bool) -> str | None:
        from referencing.exceptions import Unresolvable

        try:
            document = json.loads(text)
        except ValueError as exc:  # RecursionError on absurd nesting is one too
            return f"not JSON: {exc}"[:REASON_CHARS]
        except RecursionError:
            return "not JSON: nested too deeply to read"
        validator = self._validator(rule)
        self._deadline = deadline
        try:
            error = next(iter(validator.iter_errors(document)), None)
        except _OutOfTime:
            return self._over(by_experiment)
        except Unresolvable as exc:
            ref = getattr(exc, "ref", None) or str(exc)
            return (
                f"its reference {ref!s:.120} cannot be followed: only references inside the schema "
                "are, and nothing is fetched"
            )
        except RecursionError:
            return "the schema nests too deeply to check"
        finally:
            self._deadline = float("inf")
        if error is None:
            return None
        where = getattr(error, "json_path", "$")
        return f"does not match the schema at {where}: {error.message}"[:REASON_CHARS]

    def _validator(self, rule: Any) -> Any:
        from jsonschema import Draft202012Validator, validators
        from referencing import Registry

        if self._cls is None:
            clock = self.budget.clock

            def timed(check: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
                def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
                    if clock() > self._deadline:
                        raise _OutOfTime
                    yield from check(validator, value, instance, schema)

                return checked

            self._cls = validators.extend(
                Draft202012Validator,
                validators={k: timed(v) for k, v in Draft202012Validator.VALIDATORS.items()},
            )
        key = json.dumps(rule, sort_keys=True, default=str)
        if key not in self._validators:
            # An empty registry that retrieves nothing: no $ref reaches a file or a URL.
            self._validators[key] = self._cls(rule, registry=Registry())
        return self._validators[key]


def tally(reasons: Mapping[str, int], reason: str, *, most: int = 5) -> dict[str, int]:
    """Count a failure's reason, keeping at most ``most`` distinct reasons (then "other")."""
    out = dict(reasons)
    if reason not in out and len(out) >= most:
        reason = "other reasons"
    out[reason] = out.get(reason, 0) + 1
    return out
