"""Isolate sizes its pools (apps/analysis/pool_sizing.py): the replicas each class's pool needs from
its share of the traffic and its config's capacity for it alone. Pure: no database."""

from __future__ import annotations

import math
from typing import Any

import pytest

from apps.analysis.pool_capacity import class_capacities
from apps.analysis.pool_sizing import (
    DEFAULT_HEADROOM,
    HeadroomError,
    checked_headroom,
    pool_config,
    pool_sizing,
    replicas_needed,
)
from apps.analysis.report_options import ReportOptions
from tests.analysis.builders import Plan, build, healthy

# offered req/s, capacity req/s, headroom -> replicas, utilisation (offered / (replicas x capacity))
REPLICAS = [
    ("seed 000's busy pool: 92% of 10 req/s", 9.2, 2.0, 0.2, 6, 0.766667),
    ("seed 000's quiet pool: 8% of 10 req/s, exactly 2", 0.8, 0.5, 0.2, 2, 0.8),
    ("a little over a whole number rounds up", 4.01, 1.0, 0.0, 5, 0.802),
    ("a whole number stays", 4.0, 1.0, 0.0, 4, 1.0),
    ("float division does not add a server (0.56 / 0.56 is 1.0000000000000002)", 0.56, 0.7, 0.2, 1, 0.8),
    ("nor at 0.9 / (0.6 x 0.75) = 2.0000000000000004", 0.9, 0.6, 0.25, 2, 0.75),
    ("nor at 2.1 / (0.1 x 0.7) = 30.000000000000004", 2.1, 0.1, 0.3, 30, 0.7),
    ("a trickle still needs one server", 0.001, 100.0, 0.2, 1, 0.00001),
    ("headroom 0: filled to capacity", 3.0, 1.0, 0.0, 3, 1.0),
    ("headroom 0.5: twice the servers", 3.0, 1.0, 0.5, 6, 0.5),
    ("headroom 0.99: a hundred times", 1.0, 1.0, 0.99, 100, 0.01),
    ("no traffic: no pool", 0.0, 2.0, 0.2, 0, None),
    ("no traffic, capacity unknown: still no pool", 0.0, None, 0.2, 0, None),
    ("capacity not measured: unknown, never guessed", 9.2, None, 0.2, None, None),
    ("capacity 0 (no rate kept the contract): unknown", 9.2, 0.0, 0.2, None, None),
    ("a negative capacity is no capacity", 9.2, -1.0, 0.2, None, None),
    ("an infinite capacity is no measurement", 9.2, math.inf, 0.2, None, None),
]


@pytest.mark.parametrize(
    ("offered", "capacity", "headroom", "replicas", "utilisation"),
    [c[1:] for c in REPLICAS],
    ids=[c[0] for c in REPLICAS],
)
def test_it_sizes_a_pool_from_its_offered_rate_capacity_and_headroom(
    offered: float, capacity: float | None, headroom: float, replicas: int | None, utilisation: float | None
) -> None:
    need = replicas_needed(offered_rps=offered, capacity_rps=capacity, headroom=headroom)
    assert need.servers == replicas
    assert need.utilisation == (pytest.approx(utilisation) if utilisation is not None else None)
    if need.servers:
        # Enough servers, each left its headroom, and one fewer would not do.
        assert offered <= need.servers * capacity * (1 - headroom) * (1 + 1e-9)
        assert need.servers == 1 or offered > (need.servers - 1) * capacity * (1 - headroom)
    if replicas is None:
        assert need.why


@pytest.mark.parametrize("headroom", [1, 1.0, 1.5, -0.01, math.nan, math.inf, True, "0.2", None])
def test_it_refuses_a_headroom_outside_0_to_1_naming_the_field(headroom: Any) -> None:
    with pytest.raises(HeadroomError, match="pool_headroom") as info:
        checked_headroom(headroom)
    assert info.value.field == "pool_headroom"
    with pytest.raises(ValueError, match="pool_headroom"):
        ReportOptions.from_mapping({"pool_headroom": headroom})
    with pytest.raises(ValueError, match="pool_headroom"):
        replicas_needed(offered_rps=1.0, capacity_rps=1.0, headroom=headroom)


@pytest.mark.parametrize("offered", [-1.0, math.nan, math.inf])
def test_it_refuses_an_offered_rate_that_is_no_rate(offered: float) -> None:
    with pytest.raises(ValueError, match="offered_rps"):
        replicas_needed(offered_rps=offered, capacity_rps=1.0, headroom=0.2)


def test_the_headroom_defaults_to_a_fifth_and_travels_in_the_options() -> None:
    assert ReportOptions.from_mapping(None).pool_headroom == DEFAULT_HEADROOM == 0.2
    assert ReportOptions.from_mapping({"pool_headroom": 0}).to_json()["pool_headroom"] == 0.0


# -- the pools of a whole experiment, from plain inputs --------------------------------------------

CLASSES: list[dict[str, Any]] = [
    {
        "name": "short",
        "input_tokens": 512,
        "ttft_p99_ms": 400,
        "e2e_p99_ms": 3000,
        "max_stall_ms": 250,
        "error_rate": 0.01,
    },
    {
        "name": "long",
        "input_tokens": 4096,
        "ttft_p99_ms": 5000,
        "e2e_p99_ms": 9000,
        "max_stall_ms": 1000,
        "error_rate": 0.01,
    },
]
CELLS: list[dict[str, Any]] = [
    {"cell_id": "B0", "role": "baseline", "args": {"enable_chunked_prefill": False}},
    {"cell_id": "C1", "role": "candidate", "args": {"max_num_batched_tokens": 512}},
    {"cell_id": "C2", "role": "candidate", "args": {"max_num_batched_tokens": 2048}},
]


def aggregate(
    cell: str, cls: str, p99_ms: float | None, *, offered: int, mixture: str = "prod"
) -> dict[str, Any]:
    """A pooled (cell, mixture, rate, class) with only what pool sizing reads; None p99: censored."""
    block = {"ms": p99_ms, "censored": p99_ms is None, "above_ms": 1e6 if p99_ms is None else None}
    return {
        "cell": cell,
        "mixture": mixture,
        "rate": "near",
        "class": cls,
        "repeats": [1, 2, 3],
        "pooled": {"counts": {"offered": offered}, "ttft_ms": {"p99": block}, "e2e_ms": {"p99": block}},
    }


def sized(
    *,
    capacities: dict[str, dict[str, Any]] | None,
    headroom: float = 0.2,
    mixture: dict[str, float] | None = None,
    acceptance: dict[str, Any] | None = None,
    invalid: list[str] | None = None,
    cells: list[dict[str, Any]] | None = None,
    p99: dict[tuple[str, str], float | None] | None = None,
) -> dict[str, Any]:
    weights = mixture or {"short": 0.92, "long": 0.08}
    p99 = p99 or {}
    aggregates = [
        aggregate(c["cell_id"], cls, p99.get((c["cell_id"], cls), 900.0), offered=round(weights[cls] * 3000))
        for c in (cells or CELLS)
        for cls in ("short", "long")
    ]
    # By default no cell keeps the short contract on shared capacity; every cell keeps the long one.
    accept = acceptance or {
        c["cell_id"]: {"passed": False, "checked": 1, "failures": [{"class": "short", "broken": ["ttft"]}]}
        for c in (cells or CELLS)
    }
    return dict(
        pool_sizing(
            experiment={
                "id": 7,
                "mixtures": {"prod": weights},
                "rates": {"near": 10.0},
                "tensor_parallel_size": 2,
            },
            cells=cells or CELLS,
            classes=CLASSES,
            baseline="B0",
            agreed=[("prod", "near", 1), ("prod", "near", 2)],
            runs=[{"cell": "B0", "mixture": "prod", "rate": "near", "rate_rps": 10.0, "scenario": ""}],
            aggregates=aggregates,
            acceptance=accept,
            invalid_cells=invalid or [],
            capacities=capacities,
            headroom=headroom,
        )
    )


def done(rps: float | None, *, bracketed: bool = True, status: str = "done") -> dict[str, Any]:
    return {
        "status": status,
        "capacity_rps": rps,
        "bracketed": bracketed,
        "steps": 5,
        "source": "test search",
    }


SEED_000 = {"C1": {"short": done(2.0)}, "B0": {"long": done(0.5)}}


def test_it_sizes_the_busy_pool_from_its_share_not_half_and_half() -> None:
    # Seed 000: the short class sends 92% of 10 req/s. Split evenly, 8 servers give it 4, which
    # carry 2.3 req/s each against a capacity of 2.0: out of headroom and past capacity.
    sizing = sized(capacities=SEED_000)
    short, long = sizing["pools"]
    assert (short["class"], short["cell"], short["capacity_rps"]) == ("short", "C1", 2.0)
    assert (long["class"], long["cell"], long["capacity_rps"]) == ("long", "B0", 0.5)
    point = short["points"][0]
    assert (point["share"], point["offered_rps"], point["rate_rps"]) == (0.92, 9.2, 10.0)
    assert point["measured_share"] == pytest.approx(0.92)
    assert (short["replicas"], long["replicas"]) == (6, 2)
    assert sizing["total_replicas"] == 8 and sizing["unsized"] == []
    assert short["gpus"] == 12 and short["sized_at"] == ["prod", "near"]
    for pool in sizing["pools"]:
        assert pool["points"][0]["utilisation"] <= 1 - sizing["headroom"]
    half = sizing["total_replicas"] // 2
    assert point["offered_rps"] / (half * short["capacity_rps"]) > 1 - sizing["headroom"]
    assert "short: 6 x C1 (92% of the requests)" in sizing["statement"]


def test_an_even_mix_sizes_by_capacity_alone() -> None:
    sizing = sized(capacities=SEED_000, mixture={"short": 0.5, "long": 0.5})
    # 5 req/s each: 5 / 1.6 -> 4 short servers, 5 / 0.4 -> 13 long ones.
    assert [p["replicas"] for p in sizing["pools"]] == [4, 13]


def test_a_class_with_no_traffic_at_the_agreed_points_needs_no_pool() -> None:
    sizing = sized(capacities={"C1": {"short": done(2.0)}}, mixture={"short": 1.0, "long": 0.0})
    short, long = sizing["pools"]
    assert short["replicas"] == 7  # 10 req/s / (2.0 x 0.8) = 6.25
    assert (long["cell"], long["replicas"], long["how_to_measure"]) == (None, 0, None)
    assert "offers no requests at the agreed points" in long["chosen_by"]
    assert "long: no pool (no requests at the agreed points)" in sizing["statement"]
    assert sizing["total_replicas"] == short["replicas"] and sizing["unsized"] == []


def test_a_pool_takes_the_most_replicas_over_the_agreed_points() -> None:
    sizing = dict(
        pool_sizing(
            experiment={
                "mixtures": {"a": {"short": 0.9, "long": 0.1}, "b": {"short": 0.2, "long": 0.8}},
                "rates": {},
            },
            cells=CELLS,
            classes=CLASSES,
            baseline="B0",
            agreed=[("a", "near", 1), ("b", "near", 1)],
            runs=[
                {"cell": "B0", "mixture": "a", "rate": "near", "rate_rps": 10.0},
                {"cell": "B0", "mixture": "b", "rate": "near", "rate_rps": 4.0},
            ],
            aggregates=[],
            acceptance={},
            invalid_cells=[],
            capacities=SEED_000,
            headroom=0.0,
        )
    )
    short, long = sizing["pools"]
    # short: 9 req/s at a, 0.8 at b -> 5 and 1; long: 1 req/s at a, 3.2 at b -> 2 and 7.
    assert [p["replicas"] for p in short["points"]] == [5, 1] and short["replicas"] == 5
    assert short["sized_at"] == ["a", "near"]
    assert [p["replicas"] for p in long["points"]] == [2, 7] and long["replicas"] == 7
    assert long["sized_at"] == ["b", "near"]


def test_it_says_how_to_measure_a_capacity_it_does_not_have_and_never_invents_one() -> None:
    sizing = sized(capacities={"B0": {"long": done(0.5)}})
    short, long = sizing["pools"]
    assert short["capacity_rps"] is None and short["replicas"] is None and short["gpus"] is None
    assert short["points"][0]["offered_rps"] == 9.2 and short["points"][0]["replicas"] is None
    assert "experiment_calibrate 7 --cell B0 --class short" in short["how_to_measure"]
    assert long["replicas"] == 2 and long["how_to_measure"] is None
    assert sizing["total_replicas"] is None and sizing["unsized"] == ["short"]
    assert "replicas unknown (capacity not measured)" in sizing["statement"]


@pytest.mark.parametrize(
    ("search", "note"),
    [
        (done(None), "no probed rate kept short's contract on C1 alone (lowest tried"),
        (
            done(None, status="failed") | {"reason": "RuntimeError: host lost"},
            "search is failed: RuntimeError: host lost",
        ),
        (done(None, status="queued"), "search is queued"),
        (done(None, status="lost"), "search is lost"),
    ],
    ids=["no rate passed", "failed", "queued", "lost"],
)
def test_a_search_that_found_no_capacity_leaves_the_pool_unsized_with_why(
    search: dict[str, Any], note: str
) -> None:
    search = {**search, "lowest_rate_rps": 0.5} if search["status"] == "done" else search
    sizing = sized(capacities={"C1": {"short": search}}, p99={("C1", "short"): 500.0})
    short = sizing["pools"][0]
    assert short["cell"] == "C1" and short["replicas"] is None
    assert note in short["note"]
    assert short["capacity"]["status"] == search["status"]


def test_a_capacity_that_no_step_bracketed_is_a_lower_bound() -> None:
    sizing = sized(capacities={"C1": {"short": done(2.0, bracketed=False)}, "B0": {"long": done(0.5)}})
    assert "capacity is a lower bound and the replicas an upper one" in sizing["pools"][0]["note"]


# -- which config serves each pool -------------------------------------------------------------------

# p99 (cell, class) -> ms, capacities, acceptance tweak, invalid, expected short cell, kept, why fragment
CONFIGS = [
    (
        "measured alone: the highest capacity wins",
        {},
        {"B0": {"short": done(1.0)}, "C1": {"short": done(2.5)}, "C2": {"short": done(2.0)}},
        None,
        [],
        "C1",
        "the highest capacity for short alone among the cells measured (B0 1 req/s, C1 2.5 req/s, C2 2 req/s)",
    ),
    (
        "a tie in capacity goes to plan order",
        {},
        {"C2": {"short": done(2.0)}, "C1": {"short": done(2.0)}},
        None,
        [],
        "C1",
        "highest capacity",
    ),
    (
        "an invalid cell's measurement is not used",
        {},
        {"C1": {"short": done(9.0)}, "C2": {"short": done(2.0)}},
        None,
        ["C1"],
        "C2",
        "C2 2 req/s",
    ),
    (
        "a search with no capacity is passed over for one with a capacity",
        {},
        {"C1": {"short": done(None)}, "C2": {"short": done(0.3)}},
        None,
        [],
        "C2",
        "C2 0.3 req/s",
    ),
    (
        "none measured: the lowest primary p99 on shared capacity",
        {("B0", "short"): 2358.0, ("C1", "short"): 700.0, ("C2", "short"): 1950.0},
        {},
        None,
        [],
        "C1",
        "no cell kept short's contract on shared capacity; it came closest on ttft_p99_ms (worst over the points: 700 ms)",
    ),
    (
        "none measured: keeping the contract beats a lower p99",
        {("B0", "short"): 300.0, ("C1", "short"): 100.0},
        {},
        {"B0": {"passed": False, "checked": 1, "failures": [{"class": "long", "broken": ["e2e"]}]}},
        [],
        "B0",
        "it kept short's contract at every agreed point on shared capacity",
    ),
    (
        "a censored p99 ranks last",
        {("B0", "short"): None, ("C1", "short"): None, ("C2", "short"): 5000.0},
        {},
        None,
        [],
        "C2",
        "5,000 ms",
    ),
    (
        "an invalid cell is never the sweep's best",
        {("C1", "short"): 100.0},
        {},
        None,
        ["C1"],
        "B0",
        "came closest",
    ),
]


@pytest.mark.parametrize(
    ("p99", "capacities", "acceptance", "invalid", "cell", "why"),
    [c[1:] for c in CONFIGS],
    ids=[c[0] for c in CONFIGS],
)
def test_it_gives_each_pool_the_config_that_serves_its_class_best(
    p99: dict[tuple[str, str], float | None],
    capacities: dict[str, dict[str, Any]],
    acceptance: dict[str, Any] | None,
    invalid: list[str],
    cell: str,
    why: str,
) -> None:
    accept = {
        c["cell_id"]: {"passed": False, "checked": 1, "failures": [{"class": "short", "broken": ["ttft"]}]}
        for c in CELLS
    }
    accept.update(acceptance or {})
    short = sized(capacities=capacities, p99=p99, acceptance=accept, invalid=invalid)["pools"][0]
    assert short["cell"] == cell
    assert why in short["chosen_by"]
    assert short["args"] == next(c["args"] for c in CELLS if c["cell_id"] == cell)


def test_an_aa_control_cell_is_never_a_pool_config() -> None:
    cells = [*CELLS, {"cell_id": "A1", "role": "candidate", "args": {}, "control": True}]
    short = sized(capacities={"A1": {"short": done(50.0)}}, cells=cells)["pools"][0]
    assert short["cell"] != "A1"


def test_a_cell_without_runs_of_the_class_at_an_agreed_point_is_not_ranked() -> None:
    config = pool_config(
        "short",
        cells=["B0", "C1"],
        primary="ttft_p99_ms",
        aggregates={("C1", "prod", "near", "short"): aggregate("C1", "short", 100.0, offered=10)},
        acceptance={},
        served=[("prod", "near")],
        capacities={},
    )
    assert config.cell == "C1"
    nothing = pool_config(
        "short",
        cells=["B0"],
        primary="ttft_p99_ms",
        aggregates={},
        acceptance={},
        served=[("prod", "near")],
        capacities={},
    )
    assert nothing.cell is None and "no valid cell" in nothing.chosen_by


def test_it_notes_when_the_sweeps_best_cell_is_not_the_measured_one() -> None:
    short = sized(
        capacities={"C2": {"short": done(2.0)}}, p99={("B0", "short"): 900.0, ("C1", "short"): 100.0}
    )["pools"][0]
    assert (short["cell"], short["sweep_best"]) == ("C2", "C1")
    assert (
        "C1 served short best on shared capacity, and its capacity for short alone is not measured"
        in short["note"]
    )


# -- where the capacities come from ------------------------------------------------------------------

MIXTURES = {"80-20": {"short": 0.8, "long": 0.2}, "short-only": {"short": 1.0, "long": 0}}


def search(rps: float | None, status: str = "done", rates: tuple[float, ...] = (1.0, 2.0)) -> dict[str, Any]:
    return {
        "status": status,
        "capacity_rps": rps,
        "bracketed": True,
        "steps": [{"rate_rps": r} for r in rates],
    }


SOURCES = [
    (
        "a class's own search",
        {"class_capacity": {"C1": {"short": search(1.5)}}},
        ("C1", "short"),
        (1.5, "capacity search of C1 on short alone"),
    ),
    (
        "a goodput search on a mixture of that one class",
        {"goodput_capacity": {"C1": {"short-only": search(1.2)}, "C2": {"80-20": search(3.0)}}},
        ("C1", "short"),
        (1.2, "goodput search of C1 on mixture short-only (short alone)"),
    ),
    (
        "B0's capacity probe on such a mixture",
        {"probes": [{"mixture": "short-only", "capacity_rps": 4.0, "bracketed": True, "steps": []}]},
        ("B0", "short"),
        (4.0, "B0's capacity probe on mixture short-only (short alone)"),
    ),
    (
        "a done search beats a failed one",
        {
            "class_capacity": {"C1": {"short": search(None, status="failed")}},
            "goodput_capacity": {"C1": {"short-only": search(1.1)}},
        },
        ("C1", "short"),
        (1.1, "goodput search of C1 on mixture short-only (short alone)"),
    ),
    (
        "the class's own search beats a goodput search",
        {
            "class_capacity": {"C1": {"short": search(1.5)}},
            "goodput_capacity": {"C1": {"short-only": search(1.1)}},
        },
        ("C1", "short"),
        (1.5, "capacity search of C1 on short alone"),
    ),
]


@pytest.mark.parametrize(
    ("derivation", "where", "expected"), [c[1:] for c in SOURCES], ids=[c[0] for c in SOURCES]
)
def test_it_reads_a_class_capacity_from_the_searches_that_measure_one(
    derivation: dict[str, Any], where: tuple[str, str], expected: tuple[float, str]
) -> None:
    found = class_capacities(derivation, mixtures=MIXTURES, baseline="B0")
    cell, cls = where
    entry = found[cell][cls]
    assert (entry["capacity_rps"], entry["source"]) == expected
    # A mixture of two classes measures neither alone.
    assert "long" not in found.get(cell, {}) and "C2" not in found


def test_a_searchs_lowest_rate_and_failure_reason_are_kept() -> None:
    found = class_capacities(
        {
            "class_capacity": {
                "C1": {"short": search(None, rates=(4.0, 2.0, 1.0))},
                "C2": {"long": {"status": "failed", "reason": "boom"}},
            }
        },
        mixtures=MIXTURES,
        baseline="B0",
    )
    assert found["C1"]["short"]["lowest_rate_rps"] == 1.0 and found["C1"]["short"]["steps"] == 3
    assert found["C2"]["long"] == {
        "status": "failed",
        "capacity_rps": None,
        "bracketed": None,
        "steps": 0,
        "source": "capacity search of C2 on long alone",
        "reason": "boom",
    }


# -- in the report ---------------------------------------------------------------------------------


def stalls_everywhere(cell: str, mix: str, rate: str, rep: int, cls: str, idx: int) -> dict[str, Any]:
    return {"stall_ms": 400.0} if cls == "short" else {}


def test_the_report_sizes_pools_only_when_the_decision_is_isolate() -> None:
    capacities = {"C1": {"short": done(1.0)}, "B0": {"long": done(0.5)}}
    report = build(Plan(), stalls_everywhere, class_capacities=capacities)
    assert report["decision"]["outcome"] == "isolate"
    pools = report["pools"]
    assert pools["headroom"] == 0.2 and report["options"]["pool_headroom"] == 0.2
    short, long = pools["pools"]
    # The plan's one mixture is 50/50 at 4 req/s: 2 req/s each.
    assert short["points"][0]["offered_rps"] == 2.0 and short["points"][0]["measured_share"] == 0.5
    assert (short["cell"], short["replicas"]) == ("C1", 3)  # 2 / (1.0 x 0.8) = 2.5
    assert (long["cell"], long["replicas"]) == ("B0", 5)  # 2 / (0.5 x 0.8) = 5
    assert pools["total_replicas"] == 8
    # The spec's headroom is the one applied.
    assert (
        build(Plan(), stalls_everywhere, class_capacities=capacities, options={"pool_headroom": 0})["pools"][
            "total_replicas"
        ]
        == 2 + 4
    )
    assert "pools" not in build(Plan(), healthy, class_capacities=capacities)


def test_it_reads_the_sections_the_searches_write() -> None:
    from apps.analysis import pool_capacity
    from apps.runs import selectors

    assert (pool_capacity.CLASS_CAPACITY, pool_capacity.GOODPUT) == (
        selectors.CLASS_CAPACITY,
        selectors.GOODPUT,
    )
