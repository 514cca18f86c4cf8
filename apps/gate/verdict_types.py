"""The gate's verdict: what ``verdict.gate_verdict`` returns and ``services.gate_resource``
serves as ``GET /api/v1/gates/<id>``. Types only: no Django, nothing runs here.

TypedDicts, not dataclasses: the verdict is JSON for CI jobs and rollout controllers
(clients/tailtune_gate.py reads it as a plain mapping), so it stays the plain dict it always
was. tests/test_typed_contracts.py checks real verdicts against these declarations.
docs/GATE.md documents each field.

No ``from __future__ import annotations`` here: on Python 3.11 a TypedDict's
``__required_keys__`` ignores ``NotRequired`` written as a string annotation. Keys named
``class`` and ``pass`` (keywords) use the functional form.
"""

from typing import Literal, NotRequired, TypedDict

Verdict = Literal["running", "pass", "regression", "inconclusive"]
Outcome = Literal["pass", "fail", "skipped"]


class Unanswered(TypedDict):
    """One side's requests of a class over its done runs, when its tail is censored."""

    offered: int
    unfinished: int
    failed: int  # rejected, errors, timeouts, not sent


class CaseValues(TypedDict, total=False):
    """A case's numbers, from its first point or the point that failed; a case no comparison
    measured (error_rate, quality) has none. A censored side has no value, only the bound it is
    known to be above and its unanswered requests."""

    b0: float | None
    candidate: float | None
    diff: float | None
    ci: list[float | None] | None
    b0_above: float | None
    b0_unanswered: Unanswered
    candidate_above: float | None
    candidate_unanswered: Unanswered
    # The drift between runs the gate allowed for (verdict._drift): the repeats' pooled spread
    # (0.18: runs 18% apart), [B0's, the candidate's] repeats, and the smallest worsening (relative
    # to B0) the repeats' one-sided test at ``stand_out_alpha`` calls significant, before Holm.
    repeats_sd_rel: float | None
    repeats: list[int]
    stand_out_rel: float | None
    stand_out_alpha: float


_CaseName = TypedDict("_CaseName", {"class": str, "metric": str, "unit": str, "confidence": float})


class GateCase(_CaseName, CaseValues):
    """One class × metric (a JUnit test case)."""

    outcome: Outcome
    message: str | None


class GateVerdict(TypedDict):
    """One candidate against B0 (verdict.gate_verdict). ``exit_code`` is None while running;
    ``baseline`` and ``candidate`` are named once a report was read."""

    verdict: Verdict
    exit_code: int | None
    baseline: NotRequired[str]
    candidate: NotRequired[str]
    reasons: list[str]
    cases: list[GateCase]


class GateProgress(TypedDict):
    total: int
    finished: int
    by_status: dict[str, int]


_Pass = TypedDict("_Pass", {"pass": bool})


class GateResource(GateVerdict, _Pass):
    """The verdict resource (services.gate_resource): the verdict, the experiment around it, and
    ``pass`` for controllers that test one boolean."""

    gate: int
    experiment: int
    name: str
    url: str
    status: str
    traffic: str
    trace_sha256: str | None
    progress: GateProgress
