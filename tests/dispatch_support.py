"""Hold back the tasks a service sends (apps/runs/dispatch.py), so a unit test never reaches
the broker; the rest still go out."""

from __future__ import annotations

from typing import Any

import pytest

from apps.runs import dispatch


def hold_tasks(monkeypatch: pytest.MonkeyPatch, *names: str) -> list[tuple[str, dict[str, Any], str]]:
    """Hold the tasks ``names`` (every task when none is named); returns what was held, as
    (name, kwargs, queue) in the order sent."""
    for name in names:
        assert name in dispatch.TASKS, name
    held: list[tuple[str, dict[str, Any], str]] = []
    real = dispatch.send

    def send(name: str, *, kwargs: dict[str, Any], queue: str) -> None:
        if not names or name in names:
            held.append((name, kwargs, queue))
            return
        real(name, kwargs=kwargs, queue=queue)

    monkeypatch.setattr(dispatch, "send", send)
    return held
