"""The quality contract (check 2): the probe's answers of each candidate against B0's, token by
token, with the class's minima and validators; a failing candidate cannot be accepted."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from apps.analysis.quality_verdict import agreement, quality_check
from apps.analysis.validators import ValidatorBudget
from apps.experiments.spec import SpecError, validate_spec
from tests.analysis.builders import Plan, build
from tests.analysis.test_decision_table import slow_short_b0
from tests.experiments.factories import small_spec

B0_TOKENS = [5, 6, 7, 8, 9, 10, 11, 12]


def probe(run: str, cell: str, answers: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Four prompts per class; ``answers`` overrides an index's answer (default: B0's)."""
    outputs = []
    for i in range(8):
        o = {"index": i, "class": "short" if i < 4 else "long", "token_ids": list(B0_TOKENS),
             "text": '{"ok": true}', "finish_reason": "stop"}  # fmt: skip
        o.update((answers or {}).get(i, {}))
        outputs.append(o)
    return {"run": run, "cell": cell, "trace_sha256": "p" * 64, "outputs": outputs}


def test_agreement_is_the_common_prefix() -> None:
    assert agreement([1, 2, 3], [1, 2, 3]) == 3
    assert agreement([1, 2, 3], [1, 9, 3]) == 1
    assert agreement([], [1]) == 0 and agreement([1, 2], [1, 2, 3]) == 2


def test_b0_against_itself_agrees_fully() -> None:
    classes = [{"name": "short", "quality": {"min_exact_match": 1.0}}, {"name": "long"}]
    cells = [{"cell_id": "B0"}]
    result = quality_check(
        cells=cells, classes=classes, baseline="B0", probes=[probe("r1", "B0"), probe("r2", "B0")]
    )
    assert result["status"] == "pass" and result["reference_run"] == "r1"
    short = result["cells"]["B0"]["short"]
    assert short["exact_match"] == 1.0 and short["mean_agreement_tokens"] == 8 and short["passed"]


# id, C1's answers by index, class quality, C1 passes
CASES = [
    ("identical", {}, {"min_exact_match": 1.0, "min_agreement_tokens": 8}, True),
    ("one answer differs at token 2", {0: {"token_ids": [5, 6, 99]}}, {"min_exact_match": 0.9}, False),
    ("agreement above its minimum", {0: {"token_ids": [5, 6, 7, 8, 9, 10, 11, 99]}}, {"min_agreement_tokens": 7.5}, True),
    ("an error answer disagrees", {1: {"token_ids": [], "error": "HTTPStatusError: 500"}}, {"min_exact_match": 0.8}, False),
    ("regex validator", {2: {"text": "nope"}}, {"validators": {"regex": "ok"}}, False),
    ("json schema validator", {3: {"text": '{"ok": "yes"}'}},
     {"validators": {"json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}, False),
    ("finish reason validator", {0: {"finish_reason": "length"}}, {"validators": {"finish_reason": "stop"}}, False),
    ("every validator holds", {}, {"validators": {"regex": "ok", "finish_reason": "stop", "json_schema": {"type": "object"}}}, True),
]  # fmt: skip


@pytest.mark.parametrize(("answers", "contract", "passes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_candidate_is_held_to_its_classes_quality_contract(answers, contract, passes) -> None:  # type: ignore[no-untyped-def]
    plan = Plan()
    plan = replace(plan, classes=[{**plan.classes[0], "quality": contract}, plan.classes[1]])
    probes = [probe("b", "B0"), probe("c1", "C1", answers), probe("c2", "C2")]
    report = build(plan, slow_short_b0, quality_probes=probes)
    q = report["checks"]["quality"]["cells"]["C1"]["short"]
    assert q["passed"] is passes, q
    c1 = report["checks"]["acceptance"]["cells"]["C1"]
    quality_failures = [f for f in c1["failures"] if f["broken"] == ["quality"]]
    assert bool(quality_failures) is not passes
    # Without the quality gate C1 wins (lowest short TTFT); failing it, C2 does.
    assert report["decision"]["chosen_cell"] == ("C1" if passes else "C2"), report["decision"]


def test_without_a_probe_the_check_says_not_run_and_gates_nothing() -> None:
    report = build(Plan(), slow_short_b0)
    assert report["checks"]["quality"]["status"] == "not run"
    assert report["decision"]["chosen_cell"] == "C1"


def test_the_spec_names_every_bad_quality_field() -> None:
    spec = small_spec()
    spec["classes"][0]["quality"] = {
        "min_exact_match": 1.5,
        "validators": {"regex": "([", "json_schema": {"type": 5}, "finish_reason": "eos", "llm_judge": 1},
    }
    spec["quality"] = {"probe": {"prompts_per_class": 0, "max_tokens": 2000, "trace_sha256": "nothex"}}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    paths = {e.path for e in info.value.errors}
    assert {
        "classes[0].quality.min_exact_match",
        "classes[0].quality.validators",
        "classes[0].quality.validators.regex",
        "classes[0].quality.validators.json_schema",
        "classes[0].quality.validators.finish_reason",
        "quality.probe.prompts_per_class",
        "quality.probe.max_tokens",
        "quality.probe.trace_sha256",
    } <= paths, paths
    # A class's quality alone turns the probe on, with its defaults.
    spec = small_spec()
    spec["classes"][0]["quality"] = {"min_exact_match": 0.95}
    assert validate_spec(spec)["quality"] == {
        "probe": {"prompts_per_class": 8, "max_tokens": 32, "trace_sha256": None}
    }


@pytest.mark.django_db
def test_the_results_page_shows_the_probe_per_cell_and_class(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    from apps.analysis.models import Decision

    decision = Decision.objects.get(experiment=analysed_experiment)
    checks = dict(decision.checks)
    checks["quality"] = quality_check(
        cells=[{"cell_id": "B0"}, {"cell_id": "C1"}],
        classes=[{"name": "short", "quality": {"min_exact_match": 1.0}}, {"name": "long"}],
        baseline="B0",
        probes=[probe("b", "B0"), probe("c", "C1", {0: {"token_ids": [1]}})],
    )
    decision.checks = checks
    decision.report = {**decision.report, "checks": checks}
    decision.save()
    client.force_login(viewer)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert 'id="quality-table"' in page and "breaks exact_match" in page and "75%" in page


def test_a_contract_is_never_passed_without_answers_to_compare() -> None:
    cells = [{"cell_id": "B0"}, {"cell_id": "C1"}]
    classes = [{"name": "short", "quality": {"min_exact_match": 0.9}}, {"name": "long"}]
    not_run = quality_check(cells=cells, classes=classes, baseline="B0", probes=[])
    assert not_run["status"] == "fail" and not_run["cells"]["C1"]["short"]["broken"] == [
        "the quality probe did not run"
    ]
    no_b0 = quality_check(cells=cells, classes=classes, baseline="B0", probes=[probe("c", "C1")])
    assert no_b0["cells"]["C1"]["short"]["broken"] == ["no probe answers of B0 to compare with"]
    no_c1 = quality_check(cells=cells, classes=classes, baseline="B0", probes=[probe("b", "B0")])
    assert no_c1["failing_cells"] == ["C1"] and not no_c1["cells"]["C1"]["short"]["passed"]
    # Without any contract, no probe is simply "not run".
    plain = quality_check(cells=cells, classes=[{"name": "short"}], baseline="B0", probes=[])
    assert plain["status"] == "not run" and plain["failing_cells"] == []


def test_where_b0_stopped_sooner_its_own_length_is_the_agreement_to_reach() -> None:
    cells = [{"cell_id": "B0"}, {"cell_id": "C1"}]
    classes = [{"name": "short", "quality": {"min_agreement_tokens": 6}}, {"name": "long"}]
    short_b0 = {i: {"token_ids": [5, 6, 7]} for i in range(4)}
    same = quality_check(
        cells=cells,
        classes=classes,
        baseline="B0",
        probes=[probe("b", "B0", short_b0), probe("c", "C1", short_b0)],
    )
    assert (
        same["cells"]["C1"]["short"]["passed"] and same["cells"]["C1"]["short"]["mean_agreement_tokens"] == 3
    )
    worse = {i: {"token_ids": [5, 6, 9]} for i in range(4)}
    differs = quality_check(
        cells=cells,
        classes=classes,
        baseline="B0",
        probes=[probe("b", "B0", short_b0), probe("c", "C1", worse)],
    )
    assert differs["cells"]["C1"]["short"]["broken"] == ["mean_agreement_tokens"]


def test_a_schema_may_not_reach_outside_itself_nor_use_patterns() -> None:
    spec = small_spec()
    for schema, word in (
        ({"$ref": "file:///etc/hostname"}, "outside"),
        ({"type": "string", "pattern": "(a+)+$"}, "pattern"),
    ):
        spec["classes"][0]["quality"] = {"validators": {"json_schema": schema}}
        with pytest.raises(SpecError) as info:
            validate_spec(spec)
        assert any(
            e.path == "classes[0].quality.validators.json_schema" and word in e.message
            for e in info.value.errors
        )
    spec["classes"][0]["quality"] = {
        "validators": {"json_schema": {"$defs": {"a": {"type": "object"}}, "$ref": "#/$defs/a"}}
    }
    validate_spec(spec)


def validated(
    schema_or_regex: dict[str, Any], texts: dict[int, str], budget: ValidatorBudget
) -> dict[str, Any]:
    """C1's short class judged by one validator, its answers' texts by index."""
    kind = "regex" if isinstance(schema_or_regex, dict) and "regex" in schema_or_regex else "json_schema"
    rule = schema_or_regex["regex"] if kind == "regex" else schema_or_regex
    classes = [{"name": "short", "quality": {"validators": {kind: rule}}}, {"name": "long"}]
    answers = {i: {"text": t} for i, t in texts.items()}
    result = quality_check(
        cells=[{"cell_id": "B0"}, {"cell_id": "C1"}],
        classes=classes,
        baseline="B0",
        probes=[probe("b", "B0"), probe("c", "C1", answers)],
        budget=budget,
    )
    return dict(result["cells"]["C1"]["short"])


def test_a_regex_that_backtracks_without_end_fails_the_answer_with_the_budget_reason() -> None:
    entry = validated(
        {"regex": r"(x+x+)+y"},
        {0: "x" * 5000, 1: "xxy", 2: "xxy", 3: "xxy"},
        ValidatorBudget(answer_s=0.05, experiment_s=60),
    )
    assert entry["validators"] == {"regex": 0.75}
    failures = entry["validator_failures"]["regex"]
    assert failures["ran past its time budget (0.05 s an answer)"] == 1, failures
    assert not entry["passed"] and entry["broken"] == ["validator regex"]


def test_a_schema_stored_before_the_bounds_is_stopped_by_the_budget_not_waited_for() -> None:
    """An experiment stored before the spec bounded schemas still carries one whose references
    double per level (2**20 leaves an answer): each answer fails by its budget instead."""
    from tests.experiments.test_quality_bounds import chained_schema

    entry = validated(chained_schema(20), {}, ValidatorBudget(answer_s=0.05, experiment_s=60))
    assert entry["validators"] == {"json_schema": 0.0}
    assert entry["validator_failures"]["json_schema"] == {"ran past its time budget (0.05 s an answer)": 4}
    assert entry["broken"] == ["validator json_schema"]


def test_the_experiments_budget_once_spent_fails_every_later_answer_with_that_reason() -> None:
    ticks = iter(range(10**6))
    budget = ValidatorBudget(answer_s=1000, experiment_s=5, clock=lambda: float(next(ticks)))
    entry = validated({"type": "object"}, {}, budget)
    # B0's answers (judged first) spent the experiment's budget; C1's are not judged at all.
    assert entry["validator_failures"]["json_schema"] == {
        "not judged: the analysis spent its validator budget (5 s an experiment)": 4
    }
    assert not entry["passed"]


def test_a_reference_outside_the_schema_is_never_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    fetched: list[Any] = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: fetched.append(a))
    for ref in ("https://example.com/s.json", "file:///etc/hostname"):
        entry = validated({"$ref": ref}, {}, ValidatorBudget())
        assert entry["validators"] == {"json_schema": 0.0}
        (reason,) = entry["validator_failures"]["json_schema"]
        assert "reference" in reason and ref in reason, reason
    assert fetched == []


def test_an_answer_failing_a_validator_says_why() -> None:
    entry = validated({"type": "object", "required": ["ok"]}, {0: "not json", 1: "[1]"}, ValidatorBudget())
    failures = entry["validator_failures"]["json_schema"]
    assert set(failures) == {
        "not JSON: Expecting value: line 1 column 1 (char 0)",
        "does not match the schema at $: [1] is not of type 'object'",
    }, failures


def test_the_probe_cannot_ask_for_more_than_it_allows() -> None:
    spec = small_spec()
    spec["classes"][0]["quality"] = {"min_agreement_tokens": 40}
    spec["quality"] = {"probe": {"max_tokens": 1100}}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    paths = {e.path for e in info.value.errors}
    assert "quality.probe.max_tokens" in paths  # over the bound and over max_model_len with long's input
    spec["quality"] = {"probe": {"max_tokens": 32}}
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert {e.path for e in info.value.errors} == {"classes[0].quality.min_agreement_tokens"}


@pytest.mark.django_db
def test_the_exported_spec_keeps_the_quality_contract() -> None:
    from apps.experiments.services import experiment_to_spec
    from tests.experiments.factories import make_experiment

    classes = small_spec()["classes"]
    classes[0] = {**classes[0], "quality": {"min_exact_match": 0.9, "validators": {"finish_reason": "stop"}}}
    experiment = make_experiment(classes=classes, quality={"probe": {"prompts_per_class": 4}})
    exported = experiment_to_spec(experiment=experiment)
    again = validate_spec(exported)
    assert again["quality"] == {"probe": {"prompts_per_class": 4, "max_tokens": 32, "trace_sha256": None}}
    assert again["classes"][0]["quality"] == {"min_exact_match": 0.9, "validators": {"finish_reason": "stop"}}


@pytest.mark.django_db
def test_the_hosts_budget_stops_a_backtracking_regex_and_the_results_page_says_so(
    client,  # type: ignore[no-untyped-def]
    viewer,
    settings,
) -> None:
    """End to end: the setting reaches the analysis the worker runs, the report records why the
    answer failed, and the results page shows it."""
    from apps.analysis.models import Decision
    from apps.runs.models import Run
    from tests.experiments.factories import make_experiment
    from tests.ui.factories import analysed

    settings.TAILTUNE_VALIDATOR_ANSWER_MS = 50
    classes = small_spec()["classes"]
    classes[0] = {**classes[0], "quality": {"validators": {"regex": r"(x+x+)+y"}}}
    experiment = make_experiment(classes=classes)
    for run in Run.objects.filter(experiment=experiment).select_related("cell"):
        text = "x" * 5000 if run.cell.cell_id != "B0" else "xxy"
        outputs = [
            {"index": i, "class": "short", "token_ids": [1, 2], "text": text, "finish_reason": "stop"}
            for i in range(2)
        ]
        run.summary = {**(run.summary or {}), "quality_probe": {"trace_sha256": "p" * 64, "outputs": outputs}}
        run.save(update_fields=["summary"])
    analysed(experiment)
    quality = Decision.objects.get(experiment=experiment).report["checks"]["quality"]
    candidate = next(c for c in quality["cells"] if c != "B0")
    short = quality["cells"][candidate]["short"]
    assert short["broken"] == ["validator regex"]
    assert set(short["validator_failures"]["regex"]) == {"ran past its time budget (0.05 s an answer)"}
    assert quality["cells"]["B0"]["short"]["validator_failures"] == {}
    client.force_login(viewer)
    page = client.get(f"/experiments/{experiment.pk}/results/").content.decode()
    assert "regex failed:" in page and "ran past its time budget (0.05 s an answer)" in page
