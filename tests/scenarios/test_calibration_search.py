"""The capacity probe's search and pass rule, without an engine."""

from __future__ import annotations

import pytest

from apps.runs.capacity import capacity_of, frozen_rates, next_rate, probe_passed


def search(
    capacity: float, *, start: float = 1.0, tolerance: float = 0.1, max_steps: int = 12
) -> list[tuple[float, bool]]:
    history: list[tuple[float, bool]] = []
    while (
        rate := next_rate(history=history, start_rps=start, tolerance=tolerance, max_steps=max_steps)
    ) is not None:
        history.append((rate, rate <= capacity))
    return history


def test_it_doubles_then_bisects_to_the_tolerance() -> None:
    history = search(5.0)
    assert [r for r, _ in history[:4]] == [1.0, 2.0, 4.0, 8.0]
    found, bracketed = capacity_of(history)
    assert bracketed and found is not None and 5.0 * 0.9 <= found <= 5.0
    fails = min(r for r, ok in history if not ok)
    assert (fails - found) / fails <= 0.1


def test_it_halves_below_a_failing_start_rate() -> None:
    history = search(0.3, start=2.0)
    assert [r for r, _ in history[:3]] == [2.0, 1.0, 0.5]
    found, _ = capacity_of(history)
    assert found is not None and 0.27 <= found <= 0.3


def test_it_stops_at_max_steps_and_says_the_capacity_was_not_bracketed() -> None:
    history = search(1000.0, max_steps=3)
    assert len(history) == 3
    assert capacity_of(history) == (4.0, False)


def test_it_never_reports_a_capacity_above_a_failure() -> None:
    # A noisy pass above a failure does not raise the capacity.
    assert capacity_of([(1.0, True), (2.0, False), (1.5, True), (1.75, True), (1.9, False), (2.5, True)]) == (
        1.75,
        True,
    )
    assert capacity_of([(1.0, False), (0.5, False)]) == (None, True)


def _class(met: bool = True, accepted: float = 1.0, offered: int = 10) -> dict:
    return {"counts": {"offered": offered}, "contract": {"met": met, "ttft": met}, "accepted_share": accepted}


def test_it_passes_a_step_only_when_every_mixture_class_keeps_its_contract_and_is_accepted() -> None:
    weights = {"short": 0.8, "long": 0.2, "unused": 0.0}
    ok, reasons = probe_passed(
        status="done",
        per_class={"short": _class(), "long": _class()},
        weights=weights,
        min_accepted_share=0.99,
    )
    assert ok and reasons == []
    ok, reasons = probe_passed(
        status="done",
        per_class={"short": _class(), "long": _class(met=False)},
        weights=weights,
        min_accepted_share=0.99,
    )
    assert not ok and reasons == ["long: contract broken (ttft)"]
    ok, reasons = probe_passed(
        status="done",
        per_class={"short": _class(accepted=0.98), "long": _class()},
        weights=weights,
        min_accepted_share=0.99,
    )
    assert not ok and "accepted/offered 0.98" in reasons[0]
    ok, reasons = probe_passed(
        status="invalid",
        per_class={"short": _class(), "long": _class()},
        weights=weights,
        min_accepted_share=0.99,
    )
    assert not ok and reasons == ["run invalid"]
    ok, _ = probe_passed(
        status="done",
        per_class={"short": _class(), "long": _class(offered=0)},
        weights=weights,
        min_accepted_share=0.99,
    )
    assert not ok


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [(10.0, {"low": 3.0, "near_capacity": 9.0}), (1.0, {"low": 0.3, "near_capacity": 0.9})],
)
def test_it_freezes_the_configured_fractions_of_the_capacity(capacity, expected) -> None:
    assert frozen_rates(capacity_rps=capacity, fractions={"low": 0.3, "near_capacity": 0.9}) == expected
