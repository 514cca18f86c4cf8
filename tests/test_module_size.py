"""Modules and functions stay readable (issue #33): a module of apps/ or workers/ over 500 lines
says in its docstring why it is one module ("Over 500 lines on purpose: ..."), and no function
is over 120 lines. Migrations are generated and exempt."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 120
REASON = "over 500 lines"


def _modules() -> list[Path]:
    return sorted(
        p for top in ("apps", "workers") for p in (ROOT / top).rglob("*.py") if "migrations" not in p.parts
    )


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_says_why_and_no_function_is_over_120_lines(path: Path) -> None:
    text = path.read_text()
    tree = ast.parse(text)
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        docstring = ast.get_docstring(tree) or ""
        assert REASON in docstring.lower(), (
            f"{path.relative_to(ROOT)} has {lines} lines and its docstring does not say why "
            f"('Over 500 lines on purpose: ...'); split it or give the reason"
        )
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
