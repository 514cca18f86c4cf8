from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import yaml

from apps.workloads.models import Trace
from apps.workloads.services import (
    TraceIntegrityError,
    TraceNotFound,
    trace_content,
    trace_import,
    trace_load,
    trace_store,
    trace_store_bytes,
    workload_traces_freeze,
)
from apps.workloads.tracefile import Trace as TraceFile
from apps.workloads.tracefile import TraceFormatError, TraceRequest, trace_dumps, trace_sha256
from tests.experiments.factories import make_experiment

pytestmark = pytest.mark.django_db


def _file(n: int = 3) -> TraceFile:
    return TraceFile(
        meta={"kind": "generated", "corpus_sha256": "c" * 64, "warmup_s": 0.0},
        requests=[TraceRequest(i, float(i), "short", 2, 3, prompt_token_ids=[5, 6 + i]) for i in range(n)],
    )


def test_it_stores_a_trace_once_by_hash() -> None:
    row = trace_store(trace=_file(), label="first")
    again = trace_store(trace=_file(), label="second")
    assert again.pk == row.pk
    assert Trace.objects.count() == 1
    data = trace_dumps(_file())
    assert row.sha256 == trace_sha256(data)
    assert gzip.decompress(bytes(row.content_gz)) == data
    assert (row.requests, row.duration_s, row.kind, row.corpus_sha256) == (3, 2.0, "generated", "c" * 64)
    assert row.stats["requests"] == 3
    assert row.label == "first"


def test_it_loads_exactly_the_bytes_its_hash_names() -> None:
    row = trace_store(trace=_file())
    assert trace_content(sha256=row.sha256) == trace_dumps(_file())
    loaded = trace_load(sha256=row.sha256)
    assert [r.prompt_token_ids for r in loaded.requests] == [[5, 6], [5, 7], [5, 8]]


def test_it_refuses_stored_bytes_that_do_not_match_their_hash() -> None:
    row = trace_store(trace=_file())
    Trace.objects.filter(pk=row.pk).update(content_gz=gzip.compress(trace_dumps(_file(4))))
    with pytest.raises(TraceIntegrityError):
        trace_load(sha256=row.sha256)
    with pytest.raises(TraceIntegrityError):
        trace_store(trace=_file())
    with pytest.raises(TraceNotFound):
        trace_load(sha256="0" * 64)


def test_it_saves_nothing_from_a_bad_upload() -> None:
    data = trace_dumps(_file()).replace(b'"index":2', b'"index":7')
    with pytest.raises(TraceFormatError) as info:
        trace_store_bytes(data=data)
    assert info.value.line == 4
    assert Trace.objects.count() == 0
    assert trace_store_bytes(data=trace_dumps(_file())).requests == 3


def _experiment(tokenizer_dir: Path, **workload: object):  # type: ignore[no-untyped-def]
    from tests.experiments.factories import SMALL_SPEC

    w = {**SMALL_SPEC["workload"], **workload}
    model = {**SMALL_SPEC["model"], "path": str(tokenizer_dir)}
    return make_experiment(model=model, workload=w)


def test_it_freezes_every_trace_of_the_plan(tokenizer_dir: Path) -> None:
    experiment = _experiment(
        tokenizer_dir,
        mixtures={"80-20": {"short": 0.8, "long": 0.2}, "short-only": {"short": 1.0}},
        rates={"low": 1.0, "high": 3.0},
        repeats=2,
        repeat_traces="fresh",
    )
    traces = workload_traces_freeze(experiment=experiment)
    assert set(traces) == {
        (m, r, k) for m in ("80-20", "short-only") for r in ("low", "high") for k in (1, 2)
    }
    assert len({t.sha256 for t in traces.values()}) == 8
    assert Trace.objects.count() == 8
    again = workload_traces_freeze(experiment=experiment)
    assert {k: t.pk for k, t in again.items()} == {k: t.pk for k, t in traces.items()}
    row = traces[("80-20", "high", 2)]
    loaded = trace_load(sha256=row.sha256)
    assert loaded.meta["repeat"] == 2 and loaded.meta["rate_rps"] == 3.0
    assert loaded.meta["tokenizer_revision"] == experiment.tokenizer_revision
    assert {r.input_tokens for r in loaded.requests} <= {64, 1024}
    uniform = workload_traces_freeze(experiment=experiment, uniform=True)
    assert uniform[("80-20", "high", 2)].corpus_sha256 == row.corpus_sha256
    assert uniform[("80-20", "high", 2)].kind == "uniform"
    assert Trace.objects.count() == 16


def test_every_repeat_replays_the_same_trace_unless_asked_for_fresh_ones(tokenizer_dir: Path) -> None:
    experiment = _experiment(tokenizer_dir, rates={"low": 1.0, "high": 3.0}, repeats=3)
    assert experiment.workload.repeat_traces == "same"
    traces = workload_traces_freeze(experiment=experiment)
    for rate in ("low", "high"):
        assert len({traces[("80-20", rate, k)].pk for k in (1, 2, 3)}) == 1
    assert traces[("80-20", "low", 1)].sha256 != traces[("80-20", "high", 1)].sha256
    assert Trace.objects.count() == 2
    assert trace_load(sha256=traces[("80-20", "low", 3)].sha256).meta["repeat"] == 1


def test_the_seed_plan_shares_its_trace_hashes_across_repeats(tokenizer_dir: Path) -> None:
    """examples/seed-sweep.yaml as written (its windows shortened to keep the test small)."""
    from tests.conftest import SEED_SPEC

    spec = yaml.safe_load(SEED_SPEC.read_text())
    assert spec["workload"]["repeat_traces"] == "same"
    workload = {**spec["workload"], "warmup_s": 1, "observation_s": 4}
    experiment = make_experiment(
        model={**spec["model"], "path": str(tokenizer_dir)},
        controls=spec["controls"],
        classes=spec["classes"],
        baseline=spec["baseline"],
        candidates=spec["candidates"],
        workload=workload,
    )
    traces = workload_traces_freeze(experiment=experiment)
    repeats = spec["workload"]["repeats"]
    assert repeats == 3
    for mixture in spec["workload"]["mixtures"]:
        for rate in spec["workload"]["rates"]:
            assert len({traces[(mixture, rate, k)].sha256 for k in range(1, repeats + 1)}) == 1
    assert Trace.objects.count() == len(spec["workload"]["mixtures"]) * len(spec["workload"]["rates"])


def test_it_saves_no_trace_when_a_later_generation_fails(tokenizer_dir: Path) -> None:
    experiment = _experiment(tokenizer_dir, mixtures={"a": {"short": 1.0}, "b": {"long": 1.0}})
    # Break the second mixture after validation: the first one's traces are
    # already generated when this fails.
    experiment.workload.mixtures = {"a": {"short": 1.0}, "b": {"gone": 1.0}}
    experiment.workload.save()
    with pytest.raises(ValueError, match="unknown class 'gone'"):
        workload_traces_freeze(experiment=experiment)
    assert Trace.objects.count() == 0


def test_it_saves_no_trace_without_a_tokenizer(tokenizer_dir: Path, tmp_path: Path) -> None:
    experiment = _experiment(tokenizer_dir)
    experiment.model_path = str(tmp_path / "no-model-here")
    experiment.save()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        workload_traces_freeze(experiment=experiment)
    assert Trace.objects.count() == 0


def test_it_imports_a_real_trace_window_as_a_stored_trace(tokenizer_dir: Path) -> None:
    from apps.workloads.importers import TraceImportError
    from tests.workloads.conftest import FIXTURES

    data = (FIXTURES / "azure_2023.csv").read_bytes()
    common = {
        "fmt": "azure",
        "tokenizer_dir": tokenizer_dir,
        "tokenizer_revision": "tiny-v1",
        "thresholds": [("short", 1024), ("long", None)],
        "max_model_len": 2048,
    }
    row = trace_import(data=data, busiest_s=10.0, speed=2.0, label="azure burst", **common)
    assert row.kind == "imported" and row.requests == 3
    trace = trace_load(sha256=row.sha256)
    assert [r.klass for r in trace.requests] == ["short", "short", "long"]
    assert trace.requests[2].input_tokens == 2048 - 12  # capped to the context
    assert trace.meta["capped_rows"] == 1 and trace.meta["speed"] == 2.0
    assert trace.requests[1].t_offset_s == pytest.approx(4.314579 / 2, abs=1e-6)
    assert trace.meta["source_sha256"] == trace_sha256(data)
    with pytest.raises(TraceImportError) as info:
        trace_import(data=data.replace(b",396,", b",3x6,"), **common)
    assert info.value.line == 3
    with pytest.raises(TraceImportError, match="import limit"):
        trace_import(data=data, max_bytes=100, **common)
    assert Trace.objects.count() == 1


def test_the_quality_probe_is_frozen_once_by_hash_with_its_prompts_per_class(tokenizer_dir: Path) -> None:
    from apps.workloads.services import quality_probe_freeze
    from tests.experiments.factories import SMALL_SPEC

    classes = [
        {**c, "quality": {"min_exact_match": 1.0}} if c["name"] == "short" else c
        for c in SMALL_SPEC["classes"]
    ]
    experiment = make_experiment(
        model={**SMALL_SPEC["model"], "path": str(tokenizer_dir)},
        classes=classes,
        quality={"probe": {"prompts_per_class": 3, "max_tokens": 16}},
    )
    row = quality_probe_freeze(experiment=experiment)
    assert row is not None and row.requests == 6
    probe = trace_load(sha256=row.sha256)
    assert [r.klass for r in probe.requests] == ["short"] * 3 + ["long"] * 3
    assert {r.output_tokens for r in probe.requests} == {16}
    assert [r.input_tokens for r in probe.requests] == [64] * 3 + [1024] * 3
    assert all(len(r.prompt_token_ids or []) == r.input_tokens for r in probe.requests)
    assert quality_probe_freeze(experiment=experiment).pk == row.pk  # the same prompts, stored once
    # Naming a stored trace uses it; naming one that is not stored refuses.
    experiment.spec = {
        "quality": {"probe": {**experiment.spec["quality"]["probe"], "trace_sha256": row.sha256}}
    }
    assert quality_probe_freeze(experiment=experiment).pk == row.pk
    experiment.spec["quality"]["probe"]["trace_sha256"] = "0" * 64
    with pytest.raises(TraceNotFound):
        quality_probe_freeze(experiment=experiment)
    assert (
        quality_probe_freeze(
            experiment=make_experiment(model={**SMALL_SPEC["model"], "path": str(tokenizer_dir)})
        )
        is None
    )
