from __future__ import annotations

import numpy as np
import pytest

from apps.analysis.columns import RecordTable
from apps.analysis.metrics import (
    Contract,
    censored_percentile,
    class_metrics,
    cohort_histograms,
    derive,
    run_window,
)
from tests.analysis.builders import CLASSES, MS, request

RUN = {"key": "r1", "warmup_s": 1.0, "observation_s": 10.0, "drain_deadline_s": 5.0}
CONTRACTS = {c["name"]: Contract.from_mapping(c) for c in CLASSES}


def analyse(records, cls="short"):
    table = RecordTable.from_records(records)
    d = derive(table, {"r1": run_window(RUN)}, CONTRACTS)
    hists = cohort_histograms(d, which="token_gaps")
    chunks = cohort_histograms(d, which="chunk_gaps")
    rows = np.flatnonzero(d.cohort & (table.cls == table.class_names.index(cls)))
    return class_metrics(
        d,
        rows,
        contract=CONTRACTS[cls],
        observation_s=10.0,
        token_hist=hists.get(("r1", cls)),
        chunk_hist=chunks.get(("r1", cls)),
    )


def planned(i: int) -> int:
    return int(1e9 + i * 0.1e9)


def test_it_excludes_warmup_and_requests_planned_outside_the_window():
    recs = [request("r1", 0, "short", int(0.5e9), warmup=True)]
    recs += [request("r1", i + 1, "short", planned(i)) for i in range(10)]
    # Planned after the window closed: not part of the cohort even if replayed.
    recs.append(request("r1", 99, "short", int(11.5e9)))
    m = analyse(recs)
    assert m["counts"]["offered"] == 10
    assert m["counts"]["completed"] == 10


def test_it_reports_per_token_latency_when_one_chunk_carries_several_tokens():
    # 4 tokens per chunk, 10 ms per token: chunks arrive 40 ms apart.
    recs = [
        request("r1", i, "short", planned(i), tokens=16, itl_ms=10.0, tokens_per_chunk=4) for i in range(20)
    ]
    m = analyse(recs)
    assert m["itl_ms"]["p50"] == pytest.approx(10.0, rel=0.03)
    assert m["itl_ms"]["p99"] == pytest.approx(10.0, rel=0.03)
    assert m["chunk_gap_ms"]["p50"] == pytest.approx(40.0, rel=0.03)
    # Token weight: 3 gaps of 4 tokens per request; chunk weight: one per gap.
    assert m["itl_ms"]["weight"] == 20 * 3 * 4
    assert m["chunk_gap_ms"]["weight"] == 20 * 3


def test_it_measures_latency_from_the_planned_arrival_and_reports_lateness_apart():
    # The generator sent every request 200 ms late; the server answered 60 ms after the send.
    recs = [request("r1", i, "short", planned(i), late_ms=200.0, ttft_ms=260.0) for i in range(20)]
    m = analyse(recs)
    assert m["lateness_ms"]["p50"] == pytest.approx(200.0)
    assert m["lateness_ms"]["max"] == pytest.approx(200.0)
    assert m["ttft_ms"]["p50"]["ms"] == pytest.approx(260.0)
    assert m["e2e_ms"]["p99"]["ms"] == pytest.approx(260.0 + 15 * 10.0 + 0.1)


def test_it_counts_every_outcome_and_keeps_failures_in_the_denominators():
    recs = [request("r1", i, "short", planned(i)) for i in range(6)]
    recs.append(request("r1", 6, "short", planned(6), status=503, error_kind="http"))
    recs.append(request("r1", 7, "short", planned(7), status=429))
    recs.append(request("r1", 8, "short", planned(8), error_kind="timeout", status=None))
    recs.append(request("r1", 9, "short", planned(9), error_kind="connect", status=None))
    recs.append(request("r1", 10, "short", planned(10), unfinished=True))
    recs.append(request("r1", 11, "short", planned(11), cancelled=True))
    recs.append(request("r1", 12, "short", planned(12), sent=False))
    recs.append(request("r1", 13, "short", planned(13), tokens=15, expected=16))  # wrong token count
    m = analyse(recs)
    c = m["counts"]
    assert c["offered"] == 14
    assert (c["completed"], c["rejected"], c["timeouts"], c["errors"]) == (7, 2, 1, 1)
    assert (c["unfinished"], c["cancelled"], c["unsent"]) == (1, 1, 1)
    assert c["sent"] == 13 and c["accepted"] == 11
    assert c["validated"] == 6 and c["good"] == 6
    assert m["contract_share"] == pytest.approx(6 / 14)
    assert m["accepted_share"] == pytest.approx(11 / 14)
    assert m["goodput_rps"] == pytest.approx(0.6)
    # Cancellations leave the error base: 7 failed of 13.
    assert m["error_rate"] == pytest.approx(7 / 13, abs=1e-6)
    assert not m["contract"]["met"] and not m["contract"]["error_rate"]


def test_it_reports_a_percentile_among_unfinished_requests_as_above_the_deadline():
    recs = [request("r1", i, "short", planned(i)) for i in range(90)]
    recs += [
        request("r1", 90 + i, "short", planned(90 + i), ttft_ms=None, unfinished=True) for i in range(10)
    ]
    m = analyse(recs)
    p99 = m["ttft_ms"]["p99"]
    assert p99["censored"] is True and p99["ms"] is None
    # Rank 99 of 100 is the 9th smallest bound (5.1 s .. 6.0 s to the 16 s deadline).
    assert p99["above_ms"] == pytest.approx((16e9 - planned(91)) / MS)
    assert m["ttft_ms"]["p50"]["ms"] == pytest.approx(50.0)
    assert m["counts"]["still_waiting"] == 10
    assert m["oldest_queue_age_ms"] == pytest.approx((16e9 - planned(90)) / MS)
    assert not m["contract"]["ttft"]


def test_it_counts_late_completions_after_the_window():
    recs = [request("r1", 0, "short", int(10.9e9), ttft_ms=2000.0), request("r1", 1, "short", planned(0))]
    m = analyse(recs)
    assert m["counts"]["late_completions"] == 1


def test_it_takes_the_nearest_rank_percentile():
    obs = np.arange(1.0, 101.0)
    assert censored_percentile(obs, np.zeros(0), 0.99)["ms"] == 99.0
    assert censored_percentile(obs, np.zeros(0), 0.5)["ms"] == 50.0
    assert censored_percentile(np.zeros(0), np.zeros(0), 0.5)["ms"] is None


def test_it_leaves_client_cancellations_out_of_end_to_end_percentiles():
    recs = [request("r1", i, "short", planned(i)) for i in range(95)]
    recs += [request("r1", 95 + i, "short", planned(95 + i), cancelled=True) for i in range(5)]
    m = analyse(recs)
    assert m["counts"]["cancelled"] == 5
    assert m["e2e_ms"]["censored"] == 0 and m["e2e_ms"]["observed"] == 95
    assert not m["e2e_ms"]["p99"]["censored"]
    # They still count as offered and not good.
    assert m["contract_share"] == pytest.approx(0.95)


def test_the_cohort_percentiles_are_the_one_at_a_time_ones():
    """metrics._percentiles reads every quantile off one partition; it must give exactly what
    censored_percentile and p999 give one by one, censored ranks and small cohorts included."""
    import numpy as np

    from apps.analysis import metrics

    rng = np.random.default_rng(7)
    for n, unseen in [(0, 0), (1, 0), (0, 3), (5, 1), (40, 39), (200, 2), (3000, 0), (3100, 40), (5000, 900)]:
        values = np.round(rng.exponential(100.0, n + unseen), 1)  # ties on purpose
        values[rng.choice(n + unseen, size=unseen, replace=False)] = np.nan
        bounds = np.round(rng.uniform(0, 500, n + unseen), 1)
        seen = ~np.isnan(values)
        obs, bnd = values[seen], bounds[~seen]
        expected = {name: metrics.censored_percentile(obs, bnd, q) for name, q in metrics.QUANTILES}
        expected["p999"] = metrics.p999(obs, bnd)
        expected["observed"], expected["censored"] = int(obs.size), int(bnd.size)
        got = metrics._percentiles(values, bounds)
        assert got == expected, (n, unseen)
        assert list(got) == list(expected) and list(got["p999"]) == list(expected["p999"])


def test_jsonable_s_shortcuts_give_what_the_general_rules_give():
    """report.jsonable takes exact built-in types first; subclasses and numpy values still go
    through the general rules, and every value comes out as before."""
    import math
    from collections import OrderedDict

    import numpy as np

    from apps.analysis.report import jsonable

    class Flag(int):
        pass

    value = {
        1: [
            1.5,
            math.inf,
            -math.inf,
            math.nan,
            np.float64(2.5),
            np.float32(np.nan),
            np.int64(7),
            np.bool_(True),
        ],
        "t": (1, "a", None, True, False),
        "o": OrderedDict([(2, np.int32(3))]),
        "s": "text",
        "f": Flag(4),
        "nested": {"x": [{"y": (np.float64(-0.0),)}]},
    }
    out = jsonable(value)
    assert out == {
        "1": [1.5, None, None, None, 2.5, None, 7, True],
        "t": [1, "a", None, True, False],
        "o": {"2": 3},
        "s": "text",
        "f": 4,
        "nested": {"x": [{"y": [-0.0]}]},
    }
    assert type(out["1"][4]) is float and type(out["1"][6]) is int and type(out["1"][7]) is bool
    assert type(out["f"]) is int and type(out["o"]) is dict
