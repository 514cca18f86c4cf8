"""The chart specs are pure functions of report aggregates (no Django needed)."""

from __future__ import annotations

from apps.analysis import charts
from apps.analysis.spread import arrival_spread

CLASSES = [
    {"name": "short", "ttft_p99_ms": 500, "e2e_p99_ms": 6000, "max_stall_ms": 250, "error_rate": 0.01},
    {"name": "long", "ttft_p99_ms": 4000, "e2e_p99_ms": 15000, "max_stall_ms": 1000, "error_rate": 0.01},
]


def _pct(ms, censored=False):  # type: ignore[no-untyped-def]
    if censored:
        return {"ms": None, "censored": True, "above_ms": ms}
    return {"ms": ms, "censored": False, "above_ms": None}


def _agg(cell, cls, p99, *, censored=False, reps=(90.0, 110.0), goodput=2.0, offered=100, accepted=100):  # type: ignore[no-untyped-def]
    lat = {"p50": _pct(p99 / 3), "p95": _pct(p99 / 2), "p99": _pct(p99, censored)}
    return {
        "cell": cell,
        "mixture": "80-20",
        "rate": "low",
        "class": cls,
        "repeats": [1, 2],
        "pooled": {
            "ttft_ms": lat,
            "e2e_ms": lat,
            "max_stall_ms": lat,
            "goodput_rps": goodput,
            "counts": {"offered": offered, "accepted": accepted},
        },
        "variation": {
            "ttft_p99": {"repeats": list(reps)},
            "e2e_p99": {"repeats": list(reps)},
            "max_stall_p99": {"repeats": list(reps)},
        },  # fmt: skip
    }


def _url(**kw):  # type: ignore[no-untyped-def]
    return "/runs?" + "&".join(f"{k}={v}" for k, v in sorted(kw.items()))


def test_it_gives_each_class_one_colour_everywhere() -> None:
    three = charts.class_colours(["short", "long", "x"])
    assert charts.class_colours(["short", "long"]) | {"x": charts.CLASS_PALETTE[2]} == three
    assert len(set(three.values())) == 3
    cells = charts.cell_colours(["B0", "C1", "C2"], "B0")
    assert cells["B0"] == charts.BASELINE_COLOUR and cells["C1"] != cells["C2"]


def test_it_draws_quantiles_with_repeat_whiskers_b0_band_and_contract_lines() -> None:
    aggs = [_agg("B0", "short", 100.0), _agg("C1", "short", 80.0), _agg("B0", "long", 900.0, censored=True)]
    near = [{**CLASSES[0], "ttft_p99_ms": 150}, {**CLASSES[1], "ttft_p99_ms": 1200}]
    fig = charts.latency_by_cell(
        aggregates=aggs, cells=["B0", "C1"], baseline="B0", classes=near, metric="ttft",
        mixture="80-20", rate="low", url_for_cell=_url,
    )  # fmt: skip
    p99_short = next(t for t in fig["data"] if t["name"] == "short p99")
    assert p99_short["y"] == [100.0, 80.0]
    assert p99_short["error_y"]["array"] == [10.0, 30.0]  # up to the slowest repeat
    assert p99_short["error_y"]["arrayminus"] == [10.0, 0.0]
    assert p99_short["marker"]["color"] == charts.class_colours(["short", "long"])["short"]
    long_p99 = next(t for t in fig["data"] if t["name"] == "long p99")
    assert long_p99["marker"]["symbol"] == ["square-open"]  # censored: drawn open at its lower bound
    assert "above" in long_p99["text"][0]
    band = fig["layout"]["shapes"][0]
    assert (band["type"], band["x0"], band["x1"]) == ("rect", -0.5, 0.5)
    limits = sorted(s["y0"] for s in fig["layout"]["shapes"] if s["type"] == "line")
    assert limits == [150, 1200]
    assert fig["layout"]["yaxis"]["title"]["text"].endswith("(ms)")
    assert p99_short["customdata"][1] == "/runs?cell=C1&mixture=80-20&rate=low"
    # Limits far above the data are named, not drawn (they would flatten every point).
    far = charts.latency_by_cell(
        aggregates=aggs, cells=["B0", "C1"], baseline="B0", classes=CLASSES, metric="ttft",
        mixture="80-20", rate="low", url_for_cell=_url,
    )  # fmt: skip
    assert [s["y0"] for s in far["layout"]["shapes"] if s["type"] == "line"] == [500]
    assert far["layout"]["xaxis"]["title"]["text"].endswith("contract above the chart: long 4,000 ms")


def test_it_marks_pass_and_fail_on_the_heatmaps() -> None:
    aggs = [
        _agg("B0", "short", 1, goodput=2.0, offered=100, accepted=100),
        _agg("C1", "short", 1, goodput=1.5, offered=100, accepted=90),
    ]
    runs = [
        {"cell": "B0", "mixture": "80-20", "rate": "low", "status": "done", "classes": {"short": {"contract": {"met": True}}}},
        {"cell": "C1", "mixture": "80-20", "rate": "low", "status": "done", "classes": {"short": {"contract": {"met": False}}}},
    ]  # fmt: skip
    good, acc = charts.goodput_heatmaps(
        aggregates=aggs, runs=runs, cells=["B0", "C1"], combos=[("80-20", "low")], url_for_cell=_url
    )
    assert good["data"][0]["z"] == [[2.0], [1.5]]
    assert good["data"][0]["text"] == [["2.00 ✓"], ["1.50 ✗"]]
    assert acc["data"][0]["z"] == [[100.0], [90.0]]
    assert good["data"][0]["colorbar"]["title"]["text"] == "req/s"
    assert acc["data"][0]["colorbar"]["title"]["text"] == "%"
    # A tile links to its own cell and point (the rate's name, not a leftover run row).
    assert good["data"][0]["customdata"] == [[_url(cell="B0", mixture="80-20", rate="low")],
                                             [_url(cell="C1", mixture="80-20", rate="low")]]  # fmt: skip


def test_it_draws_paired_differences_with_intervals_and_material_markers() -> None:
    comparisons = [
        {
            "cell": "C1",
            "mixture": "80-20",
            "rate": "low",
            "class": "short",
            "metrics": {
                "ttft_p99_ms": {"diff": -20.0, "ci": [-30.0, -12.0], "material": True, "direction": "better"},
                "goodput_rps": {"diff": 0.01, "ci": [-0.1, 0.1], "material": False, "direction": "same"},
            },
        }
    ]
    fig = charts.paired_diffs(
        comparisons=comparisons, cells=["B0", "C1"], classes=["short", "long"], mixture="80-20", rate="low",
        url_for_cell=_url,
    )  # fmt: skip
    ttft = next(t for t in fig["data"] if t["xaxis"] == "x")
    assert ttft["x"] == [-20.0]
    assert ttft["error_x"]["arrayminus"] == [10.0] and ttft["error_x"]["array"] == [8.0]
    assert ttft["marker"]["symbol"] == ["circle"]
    goodput = next(t for t in fig["data"] if t["xaxis"] == "x4")
    assert goodput["marker"]["symbol"] == ["circle-open"]
    assert fig["layout"]["xaxis4"]["title"]["text"] == "Δ Goodput (req/s)"


def test_it_skips_uniform_vs_bursty_unless_both_ran() -> None:
    runs = [{"cell": "B0", "mixture": "m", "rate": "r", "status": "done", "scenario": "", "classes": {}}]
    assert charts.uniform_vs_bursty(runs=runs, classes=["short"], cells=["B0"], url_for_cell=_url) is None
    bursty = {"short": {"ttft_ms": {"p50": _pct(10.0), "p99": _pct(50.0)}}}
    runs = [
        {"cell": "B0", "mixture": "m", "rate": "r", "status": "done", "scenario": "", "classes": bursty},
        {"cell": "B0", "mixture": "m", "rate": "r", "status": "done", "scenario": "uniform",
         "classes": {"short": {"ttft_ms": {"p50": _pct(8.0), "p99": _pct(20.0)}}}},
    ]  # fmt: skip
    fig = charts.uniform_vs_bursty(runs=runs, classes=["short"], cells=["B0"], url_for_cell=_url)
    # Each bar spans p50 to p99: the spread burstiness adds is its length.
    assert [(t["base"], t["y"]) for t in fig["data"]] == [([10.0], [40.0]), ([8.0], [12.0])]
    rows = arrival_spread(runs=runs, classes=["short"], cells=["B0"])
    assert [(r["process"], r["p50_ms"], r["p99_ms"], r["spread_ms"]) for r in rows] == [
        ("bursty", 10.0, 50.0, 40.0),
        ("uniform", 8.0, 12.0 + 8.0, 12.0),
    ]
    # A censored p99 has no value: the spread is absent, not read off its bound.
    runs[1]["classes"]["short"]["ttft_ms"]["p99"] = {"ms": None, "censored": True, "above_ms": 900.0}
    assert arrival_spread(runs=runs, classes=["short"], cells=["B0"])[1]["spread_ms"] is None


def test_it_keeps_far_off_contract_limits_out_of_the_histogram_scale() -> None:
    hist = {"width_ms": 10.0, "series": {"short": [(0.0, 3), (10.0, 5)], "long": [(10.0, 1)]}}
    fig = charts.request_histogram(
        histogram=hist, classes=["short", "long"], title="t", contracts={"short": 25.0, "long": 5000.0}
    )
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [25.0]
    assert fig["data"][1]["name"] == "long (p99 contract 5,000 ms)"
    assert fig["data"][0]["x"] == [5.0, 15.0]
