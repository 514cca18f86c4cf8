"""Imports point down (docs/ARCHITECTURE.md, "Layers"): every module of apps/, workers/, clients/
and config/ sits in a layer of the table below and imports nothing from a layer above its own,
counting the imports inside functions too. Read from the source with ``ast``; nothing is imported.

Two kinds of module stand outside their package's row:

- the entry points of an app (its views, urls, admin, template tags and management commands)
  sit in the top row with the API and the workers: they call into everything below;
- a pure module (one that imports no Django, directly, inside a function or through any of our
  modules it imports: tests/test_pure_modules.py checks the listed ones at run time) counts as the
  lowest row of apps/, so any app may use it; the GPU host's side (workers/engine, workers/replay)
  and the gate's client sit below that and import none of apps/, pure or not.

The upward imports the code base has today are listed in ``KNOWN_UPWARD`` with the step that
removes each. The list only shrinks: a new upward import fails, and so does an entry whose
import is gone (take it off the list)."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
from pathlib import Path

import pytest

from tests.test_import_cycles import _graph, _modules
from tests.test_pure_modules import PURE

# Lowest first. A module belongs to the longest package named that contains it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("workers.engine", "workers.replay", "clients"),  # the GPU host's and CI's side: no Django
    ("apps.audit", "apps.accounts"),  # with every pure module of apps/
    ("apps.workloads",),
    ("apps.experiments",),
    ("apps.runs",),
    ("apps.analysis",),
    # A search's trials (#36): screened runs and their scores, below the lifecycle that drives them.
    ("apps.search",),
    # The experiment's life (#33 item 2): it moves the experiment through its statuses (the only
    # writer of Experiment.status) and drives the apps below; approvals and the gate are steps
    # built on it (a verdict is a transition; a gate creates and starts an experiment).
    ("apps.lifecycle",),
    # Notifications read the audit log's events and the experiment they name (#37 item 4).
    ("apps.approvals", "apps.gate", "apps.notifications"),
    # Across experiments (#37 item 3): reads approvals' manifests and the gate's verdicts.
    ("apps.history",),
    ("apps.api", "workers", "config"),
)
TOP = len(LAYERS) - 1
PURE_ROW = 1
ENTRY_POINTS = frozenset({"views", "urls", "admin", "templatetags", "management"})  # and views_*
# Importing any of these makes a module not pure. Celery counts: tailtune's app is configured
# from Django's settings.
DJANGO_ROOTS = frozenset(
    {"django", "rest_framework", "drf_spectacular", "drf_spectacular_sidecar", "axes", "celery"}
)

# What is left after #33 item 2 moved the experiment's life into apps/lifecycle: each reaches up
# for a reason the line gives, and the step that would remove it.
KNOWN_UPWARD: dict[tuple[str, str], str] = {
    ("apps.experiments.model_roots", "apps.runs.models"): (
        "a spec's model path is checked against the registered hosts (Host): the check moves up to "
        "where the spec is bound to hosts, or Host moves down"
    ),
    ("apps.experiments.offers", "apps.runs.models"): (
        "a spec's engine and image are checked against the registered hosts: as model_roots"
    ),
}


def _layer(module: str) -> int:
    if module == "apps":  # the namespace: an empty __init__.py
        return PURE_ROW
    parts = module.split(".")
    if parts[0] == "apps" and len(parts) > 2 and (parts[2] in ENTRY_POINTS or parts[2].startswith("views_")):
        return TOP
    best: tuple[int, int] | None = None
    for row, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and (
                best is None or len(package) > best[1]
            ):
                best = (row, len(package))
    if best is None:
        raise LookupError(f"{module} is in no layer: add its package to LAYERS")
    return best[0]


def _imports_django(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] in DJANGO_ROOTS for name in names):
            return True
    return False


def _pure(graph: Mapping[str, Set[str]], django: Set[str]) -> set[str]:
    """The modules that reach no module in ``django`` through the import graph."""
    impure = set(django)
    grew = True
    while grew:
        grew = False
        for module, targets in graph.items():
            if module not in impure and not targets.isdisjoint(impure):
                impure.add(module)
                grew = True
    return set(graph) - impure


def _rank(module: str, pure: Set[str]) -> int:
    row = _layer(module)
    return min(row, PURE_ROW) if module in pure else row


def _upward(graph: Mapping[str, Set[str]], pure: Set[str]) -> dict[tuple[str, str], str]:
    """Every import of a module ranked above the importer, with the two rows."""
    out = {}
    for source, targets in graph.items():
        for target in targets:
            low, high = _rank(source, pure), _rank(target, pure)
            if high > low:
                out[(source, target)] = f"row {low} imports row {high}"
    return out


@pytest.fixture(scope="module")
def found() -> tuple[dict[tuple[str, str], str], set[str]]:
    """Today's upward imports, and the pure modules."""
    modules = _modules()
    graph = _graph()
    pure = _pure(graph, {name for name, path in modules.items() if _imports_django(path)})
    return _upward(graph, pure), pure


def test_the_checker_flags_an_upward_import_and_lets_a_pure_one_through():
    graph = {
        "apps.workloads.services": {"apps.runs.models", "apps.analysis.stats"},
        "apps.runs.models": set(),
        "apps.analysis.stats": set(),
        "apps.runs.views": {"apps.analysis.stats", "apps.runs.models"},
        "workers.engine.idle": {"apps.analysis.stats"},
    }
    pure = _pure(graph, {"apps.runs.models"})
    assert pure == {"apps.analysis.stats", "workers.engine.idle"}
    assert set(_upward(graph, pure)) == {
        ("apps.workloads.services", "apps.runs.models"),  # row 2 imports row 4
        ("workers.engine.idle", "apps.analysis.stats"),  # the host's side reaches into apps/
    }


def test_every_module_has_a_layer():
    missing = []
    for module in _modules():
        try:
            _layer(module)
        except LookupError as error:
            missing.append(str(error))
    assert not missing, "\n".join(missing)


def test_the_pure_modules_checked_at_run_time_are_pure_here_too(found):
    _, pure = found
    assert not set(PURE) - pure, sorted(set(PURE) - pure)


def test_no_module_imports_from_a_layer_above_its_own(found):
    upward, _ = found
    new = sorted(set(upward) - set(KNOWN_UPWARD))
    assert not new, "upward imports (docs/ARCHITECTURE.md, Layers):\n" + "\n".join(
        f"{source} -> {target} ({upward[(source, target)]})" for source, target in new
    )


def test_every_listed_upward_import_still_exists(found):
    upward, _ = found
    gone = sorted(set(KNOWN_UPWARD) - set(upward))
    assert not gone, "gone, take them off KNOWN_UPWARD:\n" + "\n".join(f"{s} -> {t}" for s, t in gone)
