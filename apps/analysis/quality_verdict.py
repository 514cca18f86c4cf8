"""The quality probe judged (check 2): does a candidate say what B0 says? Pure.

Each done sweep run that ran the probe (workers/quality_probe.py) carries its greedy answers to the
frozen prompt set. Per cell and class, against B0's first such run (the reference), on the same
prompts:

- ``exact_match``: the share of answers whose generated token ids equal B0's exactly;
- ``mean_agreement_tokens``: the mean length of the common prefix with B0's answer;
- ``validators``: per validator of the class, the share of the cell's answers that pass it
  (a regular expression searched in the text, the text parsed as JSON against a schema, the
  finish reason), each answer within the analysis's time budget (apps/analysis/validators.py);
  ``validator_failures`` counts the failing answers by reason ("ran past its time budget ...").

A candidate keeps its class's quality contract when exact match and agreement are at least the
contract's minima and every answer passes every validator; a candidate that does not fails
acceptance (check 2) with ``broken: ["quality"]``. B0 is the reference: its own runs against
its first show whether the probe is deterministic on this engine, and are reported, not gated.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from apps.analysis.report_types import AcceptanceCheck, QualityCheck
from apps.analysis.validators import Judge, ValidatorBudget, tally


def agreement(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _unmeasured(cell_classes: Sequence[str], why: str) -> dict[str, Any]:
    return {
        cls: {"answers": 0, "runs": 0, "exact_match": None, "mean_agreement_tokens": None,
              "validators": {}, "broken": [why], "passed": False}
        for cls in cell_classes
    }  # fmt: skip


def quality_check(
    *,
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    baseline: str,
    probes: Sequence[Mapping[str, Any]],
    budget: ValidatorBudget | None = None,
) -> QualityCheck:
    """``probes``: one entry per done sweep run that ran the probe, in plan order:
    ``{"run", "cell", "trace_sha256", "outputs": [{"index", "class", "token_ids", "text",
    "finish_reason", "error"?}]}``. Returns the per-cell, per-class numbers and verdicts.

    A class with a quality contract is never passed without evidence: a candidate with no
    answers to compare (no probe ran, no B0 answers, another prompt set) breaks it. Validators
    run within ``budget`` (apps/analysis/validators.py): per answer and for this whole check; an
    answer that fails one, by its content or by the budget, is counted under its reason in
    ``validator_failures``.
    """
    judge = Judge(budget or ValidatorBudget())
    contracts = {c["name"]: c.get("quality") or {} for c in classes}
    contracted = [name for name, q in contracts.items() if q]
    candidates = [c["cell_id"] for c in cells if c["cell_id"] != baseline]
    reference = next((p for p in probes if p["cell"] == baseline), None)
    if reference is None:
        if not contracted:
            return {"status": "not run", "cells": {}, "reference_run": None, "failing_cells": []}
        why = "no probe answers of B0 to compare with" if probes else "the quality probe did not run"
        out = {cell: _unmeasured(contracted, why) for cell in candidates}
        return {"status": "fail", "failing_cells": candidates, "reference_run": None, "cells": out}
    ref = {int(o["index"]): o for o in reference["outputs"]}
    by_cell: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for p in probes:
        if p is not reference and p.get("trace_sha256") == reference.get("trace_sha256"):
            by_cell[p["cell"]].append(p)
    out = {}
    for cell in (c["cell_id"] for c in cells):
        runs = by_cell.get(cell, [])
        if cell == baseline and not runs:
            runs = [reference]  # B0 alone: against itself (full agreement by construction)
        if not runs:
            if cell != baseline and contracted:
                out[cell] = _unmeasured(contracted, "no probe answers on the same prompts")
            continue
        per_class: dict[str, Any] = {}
        for cls in contracts:
            exact, agree, target, answers = [], [], [], []
            contract = contracts[cls]
            minimum = contract.get("min_agreement_tokens")
            for p in runs:
                for o in p["outputs"]:
                    if o["class"] != cls or int(o["index"]) not in ref:
                        continue
                    b0 = ref[int(o["index"])]
                    mine, theirs = o.get("token_ids") or [], b0.get("token_ids") or []
                    # An answer that failed (either side) agrees with nothing.
                    failed = bool(o.get("error") or b0.get("error"))
                    exact.append(0.0 if failed or mine != theirs else 1.0)
                    agree.append(0 if failed else agreement(mine, theirs))
                    # Where B0 itself stopped sooner, its own length is all there is to agree on.
                    target.append(min(float(minimum), len(theirs)) if minimum is not None else 0.0)
                    answers.append(o)
            if not answers:
                if cell != baseline and cls in contracted:
                    per_class[cls] = _unmeasured([cls], "no probe answers of this class")[cls]
                continue
            validators: dict[str, float] = {}
            failures: dict[str, dict[str, int]] = {}
            for kind, rule in (contract.get("validators") or {}).items():
                reasons: dict[str, int] = {}
                for a in answers:
                    reason = judge.judge(kind, rule, a)
                    if reason is not None:
                        reasons = tally(reasons, reason)
                validators[kind] = round(1 - sum(reasons.values()) / len(answers), 6)
                if reasons:
                    failures[kind] = reasons
            entry: dict[str, Any] = {
                "answers": len(answers),
                "runs": len(runs),
                "exact_match": round(sum(exact) / len(exact), 6),
                "mean_agreement_tokens": round(sum(agree) / len(agree), 3),
                "validators": validators,
                "validator_failures": failures,
                "contract": dict(contract),
            }
            broken = []
            if (
                contract.get("min_exact_match") is not None
                and entry["exact_match"] < contract["min_exact_match"]
            ):
                broken.append("exact_match")
            if minimum is not None and sum(agree) < sum(target):
                broken.append("mean_agreement_tokens")
            broken += [f"validator {kind}" for kind, share in validators.items() if share < 1.0]
            entry["broken"] = broken
            entry["passed"] = not broken
            per_class[cls] = entry
        out[cell] = per_class
    failing = sorted(
        c for c, by in out.items() if c != baseline and any(not e["passed"] for e in by.values())
    )
    return {
        "status": "fail" if failing else "pass",
        "failing_cells": failing,
        "reference_run": reference["run"],
        "cells": out,
    }


def apply_to_acceptance(acceptance: AcceptanceCheck, quality: QualityCheck, *, baseline: str) -> None:
    """Check 2 enforces the quality contract: a failing candidate class is an acceptance failure."""
    for cell, by_class in (quality.get("cells") or {}).items():
        if cell == baseline or cell not in acceptance["cells"]:
            continue
        for cls, entry in by_class.items():
            if entry["passed"]:
                continue
            a = acceptance["cells"][cell]
            a["failures"].append(
                {
                    "mixture": "quality probe",
                    "rate": "",
                    "repeats": [],
                    "class": cls,
                    "broken": ["quality"],
                    "quality": {
                        k: entry[k] for k in ("exact_match", "mean_agreement_tokens", "validators", "broken")
                    }
                    | {"validator_failures": entry.get("validator_failures") or {}},
                }
            )
            a["passed"] = False
    acceptance["status"] = "pass" if any(v["passed"] for v in acceptance["cells"].values()) else "fail"
