"""The rollback manifest: content, its own digest, YAML and JSON forms. Pure: no Django.

A manifest holds the **baseline record** (everything needed to put B0 back
exactly as it ran), the approved candidate as an **overlay** on it (or none
when B0 itself was approved), the **evidence** (experiment, trace and corpus
hashes, decision) and the **approval**. Rolling back means applying the
baseline record as is: the overlay never replaces any of its values.

The digest is the sha256 of the canonical JSON of the content (sorted keys,
compact separators, ASCII): the downloaded document is the content plus a
top-level ``sha256``, so anyone can check it by removing that key and
hashing the rest (``verify``). YAML and JSON downloads carry the same
content and the same digest.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import yaml

from apps.approvals.manifest_types import (
    ApprovalRecord,
    ApprovedCandidate,
    ArgChange,
    BaselineRecord,
    EffectiveArgs,
    Evidence,
    HealthProbe,
    ManifestContent,
    ManifestDocument,
    ManifestFiles,
    Overlay,
    StoredManifest,
)
from apps.experiments.spec_types import CandidateEngine

MANIFEST_FORMAT = "tailtune-rollback-manifest"
# 2: the run record's names of the method (drain_deadline_seconds, was drain_deadline_s; issue #34).
MANIFEST_VERSION = 2
CONFIRMED = "confirmed by the engine"
REQUESTED = "requested (not confirmed by the engine)"
# vLLM's OpenAI server answers 200 on /health once the engine is ready.
HEALTH_PROBE: HealthProbe = {"path": "/health", "expect_status": 200, "interval_s": 10, "timeout_s": 5}


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def content_sha256(content: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(content)).hexdigest()


# Values local to one test run (where tailtune's worker bound the server, the devices it gave
# it, the worker's span receiver it traced to): never part of the config to deploy or roll back
# to. Kept apart, labelled.
TEST_RUN_LOCAL = frozenset(
    {"port", "host", "served_model_name", "device", "devices", "uvicorn_log_level", "otlp_traces_endpoint"}
)


def split_test_run_local(args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the deployable args, the test-run-only values), also inside ``vllm_non_default_args``."""
    keep: dict[str, Any] = {}
    local: dict[str, Any] = {}
    for key, value in args.items():
        if key in TEST_RUN_LOCAL:
            local[key] = value
        elif key == "vllm_non_default_args" and isinstance(value, Mapping):
            inner_keep, inner_local = split_test_run_local(value)
            keep[key] = inner_keep
            local.update({f"{key}.{k}": v for k, v in inner_local.items()})
        else:
            keep[key] = value
    return keep, local


def effective_args(
    requested: Mapping[str, Any], confirmed: Sequence[Mapping[str, Any] | None]
) -> EffectiveArgs:
    """The args a cell really ran with, and where that knowledge comes from.

    The engine's own report of its args wins (the most common one across the
    cell's runs; disagreement is recorded); a cell no run confirmed falls back
    to the requested args, marked as such.
    """
    split = [split_test_run_local(c) for c in confirmed if c]
    seen = [keep for keep, _ in split]
    if not seen:
        return {"args": dict(requested), "source": REQUESTED, "confirmed_runs": 0, "distinct": 0}
    counts = Counter(canonical_json(c) for c in seen)
    top, n = counts.most_common(1)[0]
    local = next(loc for keep, loc in split if canonical_json(keep) == top)
    return {
        "args": json.loads(top),
        # Where the test run's server listened, and the like: not part of what is deployed.
        "test_run_only": local,
        "source": CONFIRMED,
        "confirmed_runs": len(seen),
        "agreeing_runs": n,
        "distinct": len(counts),
    }


def complete_args(
    args: Mapping[str, Any], defaults: Mapping[str, Any], flags: Collection[str]
) -> dict[str, Any]:
    """The complete effective arguments: every arg of vLLM's parser with the value the server ran
    with. Steps:

    1. the parser's defaults that are values (``defaults``; one the engine resolves at start-up,
       None in the parser, is absent unless the server set it);
    2. overlaid with the confirmed args (``args``, test-run values already split off) that are
       parser flags (``flags``): the requested ones, with the value the engine reported;
    3. overlaid with everything vLLM logged as non-default (``vllm_non_default_args``).

    The test run's own values (where it listened, the model path it was handed) are left out:
    they are no part of what is deployed or rolled back to.
    """
    logged = args.get("vllm_non_default_args")
    out = {k: v for k, v in defaults.items() if v is not None}
    out.update({k: v for k, v in args.items() if k in flags})
    if isinstance(logged, Mapping):
        out.update(logged)
    return {k: out[k] for k in sorted(out) if k not in TEST_RUN_LOCAL and k != "model"}


def overlay_changes(
    baseline_args: Mapping[str, Any], candidate_args: Mapping[str, Any]
) -> dict[str, ArgChange]:
    """Per arg the candidate sets differently: {arg: {"baseline": b, "candidate": c}}."""
    out: dict[str, ArgChange] = {}
    for key in sorted(set(baseline_args) | set(candidate_args)):
        b, c = baseline_args.get(key), candidate_args.get(key)
        if key in candidate_args and b != c:
            out[key] = {"baseline": b, "candidate": c}
    return out


def build_manifest(
    *,
    baseline: BaselineRecord,
    candidate: ApprovedCandidate | None,
    evidence: Evidence,
    approval: ApprovalRecord,
) -> ManifestContent:
    """The manifest content (without its digest). ``candidate`` None: B0 itself was approved.

    Inputs are deep-copied: the content shares no object with its caller's data.
    """
    base = copy.deepcopy(baseline)
    candidate = copy.deepcopy(candidate)
    overlay: Overlay | None = None
    if candidate is not None:
        base_args = (base.get("effective_args") or {}).get("args") or {}
        cand_args = (candidate.get("effective_args") or {}).get("args") or {}
        overlay = {
            "cell_id": candidate["cell_id"],
            "applies_to": base.get("cell_id"),
            "effective_args": EffectiveArgs(**candidate["effective_args"]),
            "changes": overlay_changes(base_args, cand_args),
        }
        if candidate.get("engine"):
            # Another engine build or model revision: part of what the overlay changes.
            overlay["engine"] = CandidateEngine(**candidate["engine"])
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "baseline": base,
        "overlay": overlay,
        "rollback": "apply the baseline record as is; the overlay is never merged into it",
        "evidence": copy.deepcopy(evidence),
        "approval": copy.deepcopy(approval),
    }


def document(content: ManifestContent, sha256: str) -> ManifestDocument:
    """The downloadable manifest: its content plus its own digest."""
    return {**content, "sha256": sha256}


def verify(doc: StoredManifest) -> bool:
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return doc.get("sha256") == content_sha256(body)


def to_json(doc: StoredManifest) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def to_yaml(doc: StoredManifest) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=True, default_flow_style=False, allow_unicode=True)


def render(doc: StoredManifest, fmt: str) -> bytes:
    """The file's bytes in one of the two forms, UTF-8."""
    return (to_yaml(doc) if fmt == "yaml" else to_json(doc)).encode("utf-8")


def files(content: ManifestContent, sha256: str) -> ManifestFiles:
    """The model fields of both files: their bytes and each one's sha256 (what `sha256sum` prints)."""
    # Plain JSON values first (choices and other str subclasses become str), as the column stores them.
    doc = json.loads(to_json(document(content, sha256)))
    json_bytes, yaml_bytes = render(doc, "json"), render(doc, "yaml")
    return {
        "json_bytes": json_bytes,
        "json_sha256": hashlib.sha256(json_bytes).hexdigest(),
        "yaml_bytes": yaml_bytes,
        "yaml_sha256": hashlib.sha256(yaml_bytes).hexdigest(),
    }
