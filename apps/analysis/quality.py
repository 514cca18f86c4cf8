"""The quality probe judged (check 2): does a candidate say what B0 says? Pure.

Each done sweep run that ran the probe (workers/quality.py) carries its greedy answers to the
frozen prompt set. Per cell and class, against B0's first such run (the reference), on the same
prompts:

- ``exact_match``: the share of answers whose generated token ids equal B0's exactly;
- ``mean_agreement_tokens``: the mean length of the common prefix with B0's answer;
- ``validators``: per validator of the class, the share of the cell's answers that pass it
  (a regular expression searched in the text, the text parsed as JSON against a schema, the
  finish reason).

A candidate keeps its class's quality contract when exact match and agreement are at least the
contract's minima and every answer passes every validator; a candidate that does not fails
acceptance (check 2) with ``broken: ["quality"]``. B0 is the reference: its own runs against
its first show whether the probe is deterministic on this engine, and are reported, not gated.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any


def agreement(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _passes(kind: str, rule: Any, answer: Mapping[str, Any]) -> bool:
    text = str(answer.get("text") or "")
    if answer.get("error"):
        return False
    if kind == "regex":
        return re.search(rule, text) is not None
    if kind == "finish_reason":
        return answer.get("finish_reason") == rule
    if kind == "json_schema":
        from jsonschema import Draft202012Validator

        try:
            document = json.loads(text)
        except ValueError:
            return False
        return Draft202012Validator(rule).is_valid(document)
    raise ValueError(f"unknown validator {kind!r}")


def quality_check(
    *,
    cells: Sequence[Mapping[str, Any]],
    classes: Sequence[Mapping[str, Any]],
    baseline: str,
    probes: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """``probes``: one entry per done sweep run that ran the probe, in plan order:
    ``{"run", "cell", "trace_sha256", "outputs": [{"index", "class", "token_ids", "text",
    "finish_reason", "error"?}]}``. Returns the per-cell, per-class numbers and verdicts."""
    contracts = {c["name"]: c.get("quality") or {} for c in classes}
    if not probes:
        return {"status": "not run", "cells": {}, "reference_run": None}
    reference = next((p for p in probes if p["cell"] == baseline), None)
    if reference is None:
        return {"status": "no reference", "cells": {}, "reference_run": None}
    ref = {int(o["index"]): o for o in reference["outputs"]}
    by_cell: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for p in probes:
        if p is not reference:
            by_cell[p["cell"]].append(p)
    out: dict[str, Any] = {}
    for cell in (c["cell_id"] for c in cells):
        runs = by_cell.get(cell, [])
        if cell == baseline and not runs:
            runs = [reference]  # B0 alone: against itself (full agreement by construction)
        if not runs:
            continue
        per_class: dict[str, Any] = {}
        for cls in contracts:
            exact, agree, answers = [], [], []
            for p in runs:
                if p.get("trace_sha256") != reference.get("trace_sha256"):
                    continue  # another prompt set cannot be compared
                for o in p["outputs"]:
                    if o["class"] != cls or int(o["index"]) not in ref:
                        continue
                    mine, theirs = o.get("token_ids") or [], ref[int(o["index"])].get("token_ids") or []
                    same = not o.get("error") and bool(mine) and mine == theirs
                    exact.append(1.0 if same else 0.0)
                    agree.append(0 if o.get("error") else agreement(mine, theirs))
                    answers.append(o)
            if not answers:
                continue
            contract = contracts[cls]
            validators = {
                kind: round(sum(_passes(kind, rule, a) for a in answers) / len(answers), 6)
                for kind, rule in (contract.get("validators") or {}).items()
            }
            entry: dict[str, Any] = {
                "answers": len(answers),
                "runs": len(runs),
                "exact_match": round(sum(exact) / len(exact), 6),
                "mean_agreement_tokens": round(sum(agree) / len(agree), 3),
                "validators": validators,
                "contract": dict(contract),
            }
            broken = []
            if (
                contract.get("min_exact_match") is not None
                and entry["exact_match"] < contract["min_exact_match"]
            ):
                broken.append("exact_match")
            minimum = contract.get("min_agreement_tokens")
            if minimum is not None and entry["mean_agreement_tokens"] < minimum:
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


def apply_to_acceptance(acceptance: dict[str, Any], quality: Mapping[str, Any], *, baseline: str) -> None:
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
                    },
                }
            )
            a["passed"] = False
    acceptance["status"] = "pass" if any(v["passed"] for v in acceptance["cells"].values()) else "fail"
