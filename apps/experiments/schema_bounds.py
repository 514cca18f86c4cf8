"""What a quality validator's JSON schema may be: bounded before it is stored. Pure: no Django.

A class's ``json_schema`` (apps/experiments/quality_contract.py) is validated against every probe answer
of every run when the experiment is analysed, and by the gate. The ``jsonschema`` library
follows each ``$ref`` every time it meets it, so a schema of a few hundred bytes whose local
references fan out (``allOf: [$ref next, $ref next]`` per level) costs 2**depth subschemas per
answer, and a cycle costs as much as the answer's nesting. What is refused here, each with the
limit it broke and where in the schema:

1. Not JSON, or larger than the stated limits: ``MAX_SCHEMA_BYTES`` (its compact JSON text),
   ``MAX_SCHEMA_NODES`` (every value in it) or ``2 * MAX_SCHEMA_DEPTH`` levels of nesting. Checked
   first, by counting, before anything walks the schema as a schema.
2. A keyword that changes what a reference means or reaches outside the document (``$id``,
   ``$anchor``, ``$dynamicRef``, ``$dynamicAnchor``, ``$recursiveRef``, ``$recursiveAnchor``,
   ``$vocabulary``, a ``$schema`` other than Draft 2020-12), a ``$ref`` that is not a JSON
   pointer into this document (``#`` or ``#/...``) or points to no schema, and ``pattern`` or
   ``patternProperties`` (run by Python's ``re``, which has no time limit; the class's ``regex``
   validator has one).
3. References that form a cycle, or that expand, every ``$ref`` followed as the validator
   follows it, to more than ``MAX_SCHEMA_EXPANDED`` subschemas for one value or deeper than
   ``MAX_SCHEMA_DEPTH`` subschemas: computed on the graph of reference targets (each target's
   own subtree walked once), so checking a schema that would expand to billions costs no more
   than its size.

A schema that passes is bounded in work per value of the answer; the answer is bounded by the
probe's ``max_tokens``; and the analysis still runs each answer within a time budget
(apps/analysis/validators.py), which is what stops a schema stored before these limits.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

MAX_SCHEMA_BYTES = 65_536
MAX_SCHEMA_NODES = 5_000
MAX_SCHEMA_DEPTH = 24
MAX_SCHEMA_EXPANDED = 2_000
DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Draft 2020-12's keywords whose values are schemas the validator evaluates.
_ONE = frozenset(
    {"additionalProperties", "propertyNames", "items", "contains", "not", "if", "then", "else",
     "unevaluatedItems", "unevaluatedProperties"}
)  # fmt: skip
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset({"properties", "patternProperties", "dependentSchemas"})
# Schemas only a reference evaluates (and contentSchema, an annotation): walked for what they
# may not hold, never counted.
_STORED = frozenset({"$defs", "definitions"})
_REFUSED = {
    "$id": "a schema may not rename itself ($id): references are JSON pointers into this schema",
    "$anchor": "anchors ($anchor) are not allowed: refer by JSON pointer (#/$defs/name)",
    "$dynamicRef": "dynamic references ($dynamicRef) are not allowed: use $ref with a JSON pointer",
    "$dynamicAnchor": "dynamic anchors ($dynamicAnchor) are not allowed",
    "$recursiveRef": "$recursiveRef is not allowed: use $ref with a JSON pointer",
    "$recursiveAnchor": "$recursiveAnchor is not allowed",
    "$vocabulary": "$vocabulary is not allowed: the schema is read as Draft 2020-12",
    "pattern": "pattern is not allowed here: use the regex validator, which has a time limit",
    "patternProperties": "patternProperties is not allowed here: use the regex validator, which has a time limit",
}


class Unbounded(ValueError):
    """The schema cannot be bounded; the message says which limit and where (a JSON pointer)."""


def _pointer(parts: tuple[str | int, ...]) -> str:
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def check_size(schema: Any) -> None:
    """Step 1: JSON values only, and within the byte, node and nesting limits. Iterative and
    stopped at the first limit, so a huge or deep value costs no more than the limit."""
    import json
    import math

    nodes = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(schema, ())]
    while stack:
        value, at = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise Unbounded(f"holds more than {MAX_SCHEMA_NODES:,} values; the limit is {MAX_SCHEMA_NODES:,}")
        if len(at) > 2 * MAX_SCHEMA_DEPTH:
            raise Unbounded(f"is nested deeper than {2 * MAX_SCHEMA_DEPTH} levels at {_pointer(at[:8])}/...")
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise Unbounded(f"key {key!r:.40} at {_pointer(at)} is not text (JSON keys are)")
                stack.append((item, (*at, key)))
        elif isinstance(value, list):
            stack.extend((item, (*at, i)) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise Unbounded(f"the number at {_pointer(at)} is not a JSON number ({value})")
        elif not (value is None or isinstance(value, (str, bool, int, float))):
            raise Unbounded(f"the value at {_pointer(at)} is not JSON ({type(value).__name__})")
    try:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:  # e.g. an integer of more digits than Python prints
        raise Unbounded(f"cannot be written as JSON: {str(exc)[:120]}") from None
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise Unbounded(f"is {size:,} bytes as JSON; the limit is {MAX_SCHEMA_BYTES:,} bytes")


def _resolve(root: Any, ref: Any, where: str) -> tuple[str, Any]:
    """A local ``$ref`` to (its pointer, the schema it names); Unbounded for any other."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise Unbounded(
            f"$ref {ref!r:.80} at {where} points outside the schema: only local references "
            "(#/$defs/name, a JSON pointer into this schema) are allowed, and nothing is fetched"
        )
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        raise Unbounded(f"$ref {ref!r:.80} at {where} is not a JSON pointer (#/...): anchors are not allowed")
    node = root
    parts: list[str | int] = []
    part: str | int
    for raw in fragment.split("/")[1:] if fragment else []:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node, part = node[token], token
        elif isinstance(node, list) and token.isascii() and token.isdigit() and int(token) < len(node):
            node, part = node[int(token)], int(token)
        else:
            raise Unbounded(f"$ref {ref!r:.80} at {where} points to nothing in the schema")
        parts.append(part)
    if not isinstance(node, (Mapping, bool)):
        raise Unbounded(f"$ref {ref!r:.80} at {where} points to something that is not a schema")
    return _pointer(tuple(parts)), node


@dataclass
class _Target:
    """One reference target's own subtree (the root's, or a $ref's): what it costs by itself,
    and the references it holds, each with how deep in the subtree it sits."""

    size: int = 0
    height: int = 0
    refs: list[tuple[str, int]] = field(default_factory=list)


def _walk(root: Any, start: Any, at: tuple[str | int, ...], found: dict[str, Any]) -> _Target:
    """Step 2 on one target's subtree, no reference followed; new targets land in ``found``."""
    out = _Target()
    stack: list[tuple[Any, tuple[str | int, ...], int, bool]] = [(start, at, 1, True)]
    while stack:
        node, where, depth, counted = stack.pop()
        if counted:
            out.size += 1
            out.height = max(out.height, depth)
        if not isinstance(node, Mapping):
            continue  # true or false: a schema with nothing inside
        for key, value in node.items():
            here = (*where, key)
            if key in _REFUSED:
                raise Unbounded(f"{_REFUSED[key]} (at {_pointer(here)})")
            if key == "$schema" and value != DIALECT:
                raise Unbounded(f"$schema at {_pointer(here)} must be {DIALECT} (Draft 2020-12) or left out")
            if key == "$ref":
                pointer, target = _resolve(root, value, _pointer(where))
                found.setdefault(pointer, target)
                if counted:
                    out.refs.append((pointer, depth))
            elif key in _ONE or key == "contentSchema":
                stack.append((value, here, depth + 1, counted and key in _ONE))
            elif key in _LIST and isinstance(value, list):
                stack.extend((v, (*here, i), depth + 1, counted) for i, v in enumerate(value))
            elif key in _MAP and isinstance(value, Mapping):
                stack.extend((v, (*here, k), depth + 1, counted) for k, v in value.items())
            elif key in _STORED and isinstance(value, Mapping):
                stack.extend((v, (*here, k), depth + 1, False) for k, v in value.items())
    return out


def _cycle(graph: Mapping[str, list[tuple[str, int]]], left: set[str]) -> list[str]:
    """A cycle among the targets Kahn's algorithm could not order: follow edges until one repeats."""
    node = min(left)
    seen: list[str] = []
    while node not in seen:
        seen.append(node)
        node = next(t for t, _ in graph[node] if t in left)
    return [*seen[seen.index(node) :], node]


def check_references(schema: Any) -> None:
    """Steps 2 and 3: the graph of reference targets, its cycles, and its expansion."""
    found: dict[str, Any] = {"#": schema}
    targets: dict[str, _Target] = {}
    queue = deque(["#"])
    while queue:
        pointer = queue.popleft()
        if pointer in targets:
            continue
        before = set(found)
        targets[pointer] = _walk(schema, found[pointer], _parts(pointer), found)
        queue.extend(p for p in found if p not in before)
    graph = {p: t.refs for p, t in targets.items()}
    # Kahn's algorithm: a target is done when every target it refers to is.
    waiting = {p: len({t for t, _ in refs}) for p, refs in graph.items()}
    referrers: dict[str, set[str]] = defaultdict(set)
    for p, refs in graph.items():
        for t, _ in refs:
            referrers[t].add(p)
    ready = deque(p for p, n in waiting.items() if n == 0)
    order: list[str] = []
    while ready:
        p = ready.popleft()
        order.append(p)
        for q in referrers[p]:
            waiting[q] -= 1
            if waiting[q] == 0:
                ready.append(q)
    if len(order) < len(graph):
        loop = _cycle(graph, set(graph) - set(order))
        raise Unbounded(
            f"its $refs form a cycle ({' -> '.join(loop)}): a recursive schema is not bounded; "
            "write the levels out"
        )
    size: dict[str, int] = {}
    height: dict[str, int] = {}
    for p in order:  # every target after the targets it refers to
        own = targets[p]
        size[p] = own.size + sum(size[r] for r, _ in own.refs)
        height[p] = max([own.height, *(d + height[r] for r, d in own.refs)])
    problems = []
    if size["#"] > MAX_SCHEMA_EXPANDED:
        # How often each target is evaluated for one value: the references' fan-out multiplied.
        times: dict[str, int] = defaultdict(int, {"#": 1})
        for p in reversed(order):
            for r, _ in graph[p]:
                times[r] += times[p]
        worst = max((p for p in times if p != "#"), key=lambda p: times[p], default="#")
        problems.append(
            f"its $refs expand to {size['#']:,} subschemas for one value, over the limit of "
            f"{MAX_SCHEMA_EXPANDED:,} ({worst} is evaluated {times[worst]:,} times: references "
            "that repeat inside definitions that repeat multiply)"
        )
    if height["#"] > MAX_SCHEMA_DEPTH:
        problems.append(
            f"it nests {height['#']} subschemas deep with its $refs followed, over the limit of "
            f"{MAX_SCHEMA_DEPTH}"
        )
    if problems:
        raise Unbounded("; ".join(problems))


def _parts(pointer: str) -> tuple[str | int, ...]:
    """The path a pointer made by ``_pointer`` names (for messages only: keys stay text)."""
    if pointer == "#":
        return ()
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in pointer[2:].split("/"))


def check_schema_bounds(schema: Any) -> None:
    """Every check above, in order; raises Unbounded with the first problem found."""
    check_size(schema)
    check_references(schema)
