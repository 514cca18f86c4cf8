"""The results page shows the spread between whole runs beside each comparison (issue #32
item 2): the noise floor in words, the one-repeat sentence, and nothing extra for a report made
before it."""

from __future__ import annotations

import html as html_lib
from typing import Any

import pytest

from apps.analysis.models import Decision
from apps.analysis.results_charts import noise_floor_text, pct, power_rows, signed_pct
from tests.experiments.factories import make_experiment
from tests.ui.factories import analysed


def _section(page: str, marker: str) -> str:
    start = page.index(marker)
    return page[start : page.index("</table>", start)]


def test_the_noise_floor_in_words() -> None:
    floor: dict[str, Any] = {
        "metric": "ttft_p99_ms",
        "repeats": 3,
        "b0_run_sd_rel": 0.183,
        "aa_cell": "C3",
        "aa_run_sd_rel": 0.07,
        "pooled_run_sd_rel": 0.2,
        "used_run_sd_rel": 0.24,
        "df": 6,
    }
    assert noise_floor_text(floor) == (
        "runs spread by 18% (B0's 3 repeats; A/A cell C3: 7.0%); the test allowed for 24%"
    )
    assert noise_floor_text({**floor, "aa_cell": None, "aa_run_sd_rel": None, "used_run_sd_rel": None}) == (
        "runs spread by 18% (B0's 3 repeats)"
    )
    one = {"metric": "ttft_p99_ms", "repeats": 1, "b0_run_sd_rel": None, "note": "one repeat: ..."}
    assert noise_floor_text(one) == "one repeat: nothing can be called material"
    unjudged = {"metric": None, "repeats": 2, "note": "not enough requests to judge the primary metric"}
    assert noise_floor_text(unjudged) == "not enough requests to judge the primary metric"
    assert noise_floor_text(None) is None and noise_floor_text({}) is None
    # The A/A cell's observed difference from B0: the measured noise floor, signed.
    assert noise_floor_text({**floor, "aa_diff": 9.1, "aa_diff_rel": 0.031}) == (
        "runs spread by 18% (B0's 3 repeats; A/A cell C3: 7.0%); the test allowed for 24%; "
        "measured noise floor: A/A cell C3 (B0 run again) +3.1% against B0"
    )
    assert signed_pct(-0.25) == "-25%"


def test_the_power_rows_state_the_spread_only_where_the_report_has_it() -> None:
    old = {"mixture": "m", "rate": "r", "class": "short", "metric": "ttft_p99_ms", "detectable_rel": 0.2}
    new = {**old, "run_sd_rel": 0.3, "repeats": 3, "repeats_needed": 17, "note": "takes 17 repeats"}
    unknown = {**old, "run_sd_rel": None, "repeats": 1}
    rows = power_rows([old, new, unknown])
    assert "run_spread" not in rows[0]
    assert rows[1]["run_spread"] == "30% over 3 repeats"
    assert rows[2]["run_spread"] == "unknown (1 repeat)"


@pytest.mark.django_db
def test_each_comparison_shows_the_noise_floor_with_the_aa_cell(client, viewer, author) -> None:  # type: ignore[no-untyped-def]
    workload = {**make_experiment.__globals__["SMALL_SPEC"]["workload"], "repeats": 2}
    candidates = [
        {"id": "C1", "args": {"max_num_batched_tokens": 512, "max_num_seqs": 8}},
        # B0's own arguments: the A/A control cell (marked: the spec refuses an unmarked copy of B0).
        {"id": "C3", "args": {"max_num_batched_tokens": 2048, "max_num_seqs": 8}, "control": True},
    ]
    experiment = analysed(
        make_experiment(owner=author, name="floor", workload=workload, candidates=candidates), per_run=320
    )
    client.force_login(viewer)
    response = client.get(f"/experiments/{experiment.pk}/results/")
    assert response.status_code == 200
    page = html_lib.unescape(response.content.decode())
    table = _section(page, 'id="comparisons-table"')
    comparisons = experiment.decision.report["comparisons"]
    assert {(c["cell"], c["class"]) for c in comparisons} == {
        (a, b) for a in ("C1", "C3") for b in ("short", "long")
    }
    for c in comparisons:
        floor = c["noise_floor"]
        assert floor["repeats"] == 2 and floor["aa_cell"] == "C3"
        text = noise_floor_text(floor)
        assert text is not None and text in table
        if floor["b0_run_sd_rel"] is not None:
            assert f"runs spread by {pct(floor['b0_run_sd_rel'])} (B0's 2 repeats; A/A cell C3:" in text
        if floor.get("used_run_sd_rel") is not None:
            assert f"the test allowed for {pct(floor['used_run_sd_rel'])}" in text
        if floor.get("aa_diff_rel") is not None:
            assert (
                f"measured noise floor: A/A cell C3 (B0 run again) {signed_pct(floor['aa_diff_rel'])}" in text
            )
    assert any(c["noise_floor"].get("aa_diff_rel") is not None for c in comparisons)
    assert table.count("(A/A: B0 run again)") == sum(c["cell"] == "C3" for c in comparisons)
    assert experiment.decision.chosen_cell != "C3"
    assert any(noise_floor_text(c["noise_floor"]).startswith("runs spread by") for c in comparisons)  # type: ignore[union-attr]
    assert table.count("<tr><td>") == len(comparisons)
    # The power table states each class's spread between runs and what finding the margin takes.
    power = _section(page, 'id="power"')
    assert "spread between runs" in power and "over 2 repeats" in power
    for p in experiment.decision.report["statistics"]["power"]:
        if p.get("note"):
            assert p["note"] in power


@pytest.mark.django_db
def test_one_repeat_says_nothing_can_be_called_material(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    table = _section(page, 'id="comparisons-table"')
    assert table.count("one repeat: nothing can be called material") == len(
        analysed_experiment.decision.report["comparisons"]
    )


@pytest.mark.django_db
def test_a_report_made_before_the_noise_floor_renders_without_it(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    decision = analysed_experiment.decision
    report = decision.report
    for c in report["comparisons"]:
        c.pop("noise_floor", None)
    run_level = ("run_sd_rel", "run_df", "repeats", "target_rel", "repeats_needed", "note")
    report["statistics"]["power"] = [
        {k: v for k, v in p.items() if k not in run_level} for p in report["statistics"]["power"]
    ]
    Decision.objects.filter(pk=decision.pk).update(report=report)
    client.force_login(viewer)
    response = client.get(f"/experiments/{analysed_experiment.pk}/results/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="power"' in page and 'id="comparisons-table"' not in page
    assert "spread between runs" not in page and "noise floor" not in page
