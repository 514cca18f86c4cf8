"""Run digests (apps/analysis/run_digest.py): the report reads a done run's records packed once,
and what it reads is exactly what reading every record gives; a digest that no longer packs every
record, or that this code cannot read, is packed again."""

from __future__ import annotations

import json

import numpy as np
import pytest

from apps.analysis import run_digest, services
from apps.runs.ingest import records_ingest, records_server_timings_ingest
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.models import Run, RunDigest
from tests.analysis.factories import done_experiment
from tests.analysis.test_record_reader import assert_same_table
from tests.runs.factories import observed
from workers.pipeline import _finish

pytestmark = pytest.mark.django_db


def _assert_same(a: run_digest.ReportRecords, b: run_digest.ReportRecords) -> None:
    assert_same_table(a.table, b.table)
    for ha, hb in ((a.token_hists, b.token_hists), (a.chunk_hists, b.chunk_hists)):
        assert {k: dict(sorted(h.counts.items())) for k, h in ha.items()} == {
            k: dict(sorted(h.counts.items())) for k, h in hb.items()
        }
    assert a.stop_reasons == b.stop_reasons


def _runs(experiment):  # type: ignore[no-untyped-def]
    return services.report_rows(experiment_id=experiment.pk).done


def test_the_report_reads_from_digests_exactly_what_the_records_give():
    experiment, _ = done_experiment(per_run=40)
    ids = list(
        RecordRow.objects.filter(run__experiment=experiment).order_by("id").values_list("id", flat=True)
    )
    # Every shape a value can take: an error kind known and unknown, NULL times, a server timing,
    # a class name that sorts first, a finish reason, a warm-up request.
    RecordRow.objects.filter(id=ids[0]).update(error_kind="timeout", first_token_ns=None, end_ns=None)
    RecordRow.objects.filter(id=ids[1]).update(
        error_kind="something-new", http_status=None, finish_reason="length"
    )
    RecordRow.objects.filter(id=ids[2]).update(server_queue_ns=1_234_567, request_class="aaa", cancelled=True)
    runs = _runs(experiment)
    assert not RunDigest.objects.exists()
    first = run_digest.report_records(runs)  # packs every run's digest, then reads them
    assert RunDigest.objects.count() == len(runs)
    _assert_same(first, run_digest.records_read(runs))
    again = run_digest.report_records(runs)  # reads the digests only
    _assert_same(again, run_digest.records_read(runs))
    assert "aaa" in again.table.class_names
    assert any("length" in by for per_class in again.stop_reasons.values() for by in per_class.values())


def test_the_whole_report_is_the_same_read_from_digests_or_from_records(monkeypatch):
    experiment, _ = done_experiment(per_run=60)
    from_digests = services.experiment_report_build(experiment_id=experiment.pk)
    monkeypatch.setattr(services, "_report_records", run_digest.records_read)
    from_records = services.experiment_report_build(experiment_id=experiment.pk)
    assert json.dumps(from_digests, sort_keys=True, default=str) == json.dumps(
        from_records, sort_keys=True, default=str
    )


def test_a_record_written_after_the_run_was_done_drops_its_digest_and_the_report_sees_it():
    experiment, _ = done_experiment(per_run=20)
    runs = _runs(experiment)
    before = run_digest.report_records(runs)
    run = Run.objects.get(pk=runs[0]["pk"])
    # A worker given up for lost comes back with one more record of its (done) run.
    assert records_ingest(run_pk=run.pk, records=[observed(str(run.run_id), 999, ttft_ms=77.0)]) == 1
    assert not RunDigest.objects.filter(run=run).exists()
    after = run_digest.report_records(runs)
    assert len(after.table) == len(before.table) + 1
    _assert_same(after, run_digest.records_read(runs))
    # A retried batch that writes nothing keeps the digest.
    assert records_ingest(run_pk=run.pk, records=[observed(str(run.run_id), 999, ttft_ms=77.0)]) == 0
    assert RunDigest.objects.filter(run=run).exists()


def test_server_timings_joined_after_the_digest_drop_it():
    experiment, _ = done_experiment(per_run=10)
    runs = _runs(experiment)
    run_digest.report_records(runs)
    run = Run.objects.get(pk=runs[0]["pk"])
    rec = observed(str(run.run_id), 3)
    rec.server_queue_ns = 4_242
    assert records_server_timings_ingest(run_pk=run.pk, records=[rec]) == 1
    assert not RunDigest.objects.filter(run=run).exists()
    after = run_digest.report_records(runs)
    assert np.nanmax(after.table.server("server_queue_ns")) == 4_242


def test_a_digest_of_another_version_or_unreadable_is_packed_again():
    experiment, _ = done_experiment(per_run=10)
    runs = _runs(experiment)
    run_digest.report_records(runs)
    old, broken = runs[0]["pk"], runs[1]["pk"]
    RunDigest.objects.filter(run_id=old).update(version=run_digest.VERSION - 1)
    RunDigest.objects.filter(run_id=broken).update(columns=_blob('[["index", "|O", 5]]'))
    _assert_same(run_digest.report_records(runs), run_digest.records_read(runs))
    assert set(RunDigest.objects.filter(run_id__in=[old, broken]).values_list("version", flat=True)) == {
        run_digest.VERSION
    }


def _blob(header: str, payload: bytes = b"") -> bytes:
    raw = header.encode()
    return len(raw).to_bytes(4, "little") + raw + payload


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        _blob("[1,2"),  # a header cut short
        _blob('[["a", "<f8", 1000]]', b"\x00" * 8),  # more values than bytes
        _blob('[["a", "|O", 1]]', b"\x00" * 8),  # objects would need pickle
        _blob('[["a", "|b1", 1]]', b"\x01\x02"),  # bytes left over
        b"\xff\xff\xff\x7f[]",  # a header longer than the blob
    ],
)
def test_unpacking_refuses_what_pack_did_not_write(blob):
    with pytest.raises(ValueError):
        run_digest.unpack_arrays(blob)


def test_packing_round_trips_every_dtype_it_writes():
    arrays = {
        "b": np.array([True, False, True]),
        "f": np.array([1.5, np.nan, np.inf]),
        "i": np.array([-1, 2, 7], dtype=np.int16),
        "empty": np.zeros(0),
    }
    back = run_digest.unpack_arrays(run_digest.pack_arrays(arrays))
    assert list(back) == list(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype
        np.testing.assert_array_equal(back[name], a)


def test_the_pipeline_packs_a_run_s_digest_as_it_finishes_done():
    experiment, _ = done_experiment(per_run=10)
    run = experiment.runs.first()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.DRAINING)
    other = experiment.runs.exclude(pk=run.pk).first()
    Run.objects.filter(pk=other.pk).update(status=Run.Status.DRAINING)
    assert _finish(run.pk, Run.Status.DONE)
    assert _finish(other.pk, Run.Status.FAILED, "it broke")
    digest = RunDigest.objects.get(run=run)
    assert (
        digest.records == RecordRow.objects.filter(run=run).count() and digest.version == run_digest.VERSION
    )
    assert not RunDigest.objects.filter(run=other).exists()


def test_a_digest_whose_run_lost_or_gained_records_behind_its_back_is_not_read():
    """Records deleted or added without the ingest path (an operator's SQL, a restore): the run's
    record count no longer matches its digest's, so the digest is packed again before it is read."""
    experiment, _ = done_experiment(per_run=12)
    runs = _runs(experiment)
    run_digest.report_records(runs)
    first = RecordRow.objects.filter(run_id=runs[0]["pk"]).order_by("index").first()
    RecordRow.objects.filter(pk=first.pk).delete()
    after = run_digest.report_records(runs)
    _assert_same(after, run_digest.records_read(runs))
    assert (
        RunDigest.objects.get(run_id=runs[0]["pk"]).records
        == RecordRow.objects.filter(run_id=runs[0]["pk"]).count()
    )
