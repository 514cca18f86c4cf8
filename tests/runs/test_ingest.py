from __future__ import annotations

import dataclasses

import pytest

from apps.experiments.models import Experiment, RunsRefused
from apps.runs.ingest import metric_samples_ingest, records_ingest, records_server_timings_ingest
from apps.runs.models import MetricSample, RequestRecord
from tests.experiments.factories import make_experiment
from tests.runs.factories import observed
from workers.replay.records import SERVER_TIMING_FIELDS


@pytest.mark.django_db(transaction=True)
def test_it_writes_each_record_exactly_once_even_when_a_batch_is_retried() -> None:
    run = make_experiment().runs.first()
    batch = [observed(str(run.run_id), i) for i in range(50)]
    assert records_ingest(run_pk=run.pk, records=batch) == 50
    # The same batch again (a retry after a lost acknowledgement) plus 10 new ones.
    again = batch[40:] + [observed(str(run.run_id), i) for i in range(50, 60)]
    assert records_ingest(run_pk=run.pk, records=again) == 10
    assert RequestRecord.objects.filter(run=run).count() == 60
    stored = RequestRecord.objects.get(run=run, index=3)
    assert stored.first_token_ns == batch[3].first_token_ns
    assert stored.token_gaps == batch[3].token_gaps.to_json()
    assert stored.error is None and stored.http_status == 200


@pytest.mark.django_db
def test_it_keeps_unobserved_times_null() -> None:
    run = make_experiment().runs.first()
    rec = observed(str(run.run_id), 0)
    rec.first_token_ns = rec.last_token_ns = rec.output_tokens = None
    rec.error_kind, rec.error, rec.http_status = "connect", "connection refused", None
    records_ingest(run_pk=run.pk, records=[rec])
    stored = RequestRecord.objects.get(run=run)
    assert stored.first_token_ns is None and stored.output_tokens is None and stored.http_status is None
    assert stored.error == "connection refused"


@pytest.mark.django_db
def test_it_stores_metric_samples_with_their_epoch() -> None:
    run = make_experiment().runs.first()
    metric_samples_ingest(
        run_pk=run.pk,
        samples=[
            {
                "t_ns": 1,
                "phase": "before",
                "name": "vllm:num_preemptions_total",
                "kind": "counter",
                "value": 3.0,
            },
            {
                "t_ns": 2,
                "phase": "after",
                "epoch": 1,
                "name": "vllm:num_preemptions_total",
                "kind": "counter",
                "value": 1.0,
            },
        ],
    )
    assert list(MetricSample.objects.filter(run=run).order_by("t_ns").values_list("epoch", "value")) == [
        (0, 3.0),
        (1, 1.0),
    ]


@pytest.mark.django_db
def test_it_ingests_several_batches_inside_one_outer_transaction() -> None:
    # pytest's django_db wraps this test in a transaction: the temp table of the
    # first batch is still alive when the second one comes.
    run = make_experiment().runs.first()
    records_ingest(run_pk=run.pk, records=[observed(str(run.run_id), i) for i in range(5)])
    records_ingest(run_pk=run.pk, records=[observed(str(run.run_id), i) for i in range(5, 9)])
    assert RequestRecord.objects.filter(run=run).count() == 9


def _with_timings(rec, k: int):
    rec.server_queue_ns, rec.server_prefill_ns, rec.server_decode_ns = 1000 + k, 2000 + k, 3000 + k
    rec.server_ttft_ns, rec.server_e2e_ns = 4000 + k, 9000 + k
    rec.server_arrival_ns, rec.server_first_token_ns = 10_000 + k, 14_000 + k
    return rec


@pytest.mark.django_db(transaction=True)
def test_the_servers_timings_are_written_onto_records_already_stored() -> None:
    run, other = make_experiment().runs.order_by("plan_position")[:2]
    batch = [observed(str(run.run_id), i) for i in range(10)]
    records_ingest(run_pk=run.pk, records=batch)
    records_ingest(run_pk=other.pk, records=[observed(str(other.run_id), i) for i in range(10)])
    # The join after the run: spans for 8 of the 10 records (none for 3 and 7).
    joined = [_with_timings(r, r.index) if r.index not in (3, 7) else r for r in batch]
    assert records_server_timings_ingest(run_pk=run.pk, records=joined) == 8
    rows = {r.index: r for r in RequestRecord.objects.filter(run=run)}
    assert rows[5].server_queue_ns == 1005 and rows[5].server_prefill_ns == 2005
    assert (
        rows[5].server_decode_ns == 3005 and rows[5].server_ttft_ns == 4005 and rows[5].server_e2e_ns == 9005
    )
    assert all(getattr(rows[i], name) is None for i in (3, 7) for name in SERVER_TIMING_FIELDS)
    assert rows[5].first_token_ns == batch[5].first_token_ns  # the client's own fields untouched
    # Another run's records with the same indexes are not touched.
    assert not RequestRecord.objects.filter(run=other, server_e2e_ns__isnull=False).exists()
    assert records_server_timings_ingest(run_pk=run.pk, records=[observed(str(run.run_id), 0)]) == 0


@pytest.mark.django_db(transaction=True)
def test_a_record_that_already_has_its_timings_keeps_them_through_the_copy() -> None:
    run = make_experiment().runs.first()
    records_ingest(run_pk=run.pk, records=[_with_timings(observed(str(run.run_id), 0), 0)])
    stored = RequestRecord.objects.get(run=run)
    assert [getattr(stored, name) for name in SERVER_TIMING_FIELDS] == [
        1000,
        2000,
        3000,
        4000,
        9000,
        10_000,
        14_000,
    ]


@pytest.mark.django_db
def test_a_batch_with_one_timed_record_writes_its_timings_and_the_others_stay_null() -> None:
    # A batch without timings leaves their columns out of the COPY (the table fills NULL); one
    # record with them brings every column back for the whole batch.
    run = make_experiment().runs.first()
    untimed = [observed(str(run.run_id), i) for i in range(3)]
    mixed = [observed(str(run.run_id), i) for i in range(3, 6)]
    mixed[1] = _with_timings(mixed[1], 0)
    assert records_ingest(run_pk=run.pk, records=untimed) == 3
    assert records_ingest(run_pk=run.pk, records=mixed) == 3
    rows = {
        r["index"]: [r[name] for name in SERVER_TIMING_FIELDS]
        for r in RequestRecord.objects.filter(run=run).values("index", *SERVER_TIMING_FIELDS)
    }
    assert rows[4] == [1000, 2000, 3000, 4000, 9000, 10_000, 14_000]
    assert all(rows[i] == [None] * len(SERVER_TIMING_FIELDS) for i in (0, 1, 2, 3, 5))


def test_every_record_field_is_a_column_the_ingest_writes_and_the_import_reads() -> None:
    from apps.analysis.management.commands.results_import import RECORD_TYPES
    from apps.runs.ingest import _RECORD_COLUMNS
    from workers.replay.records import RequestRecord as Observed

    fields = {f.name for f in dataclasses.fields(Observed)}
    model = {f.name for f in RequestRecord._meta.concrete_fields} - {"id", "run"}
    assert set(SERVER_TIMING_FIELDS) <= fields
    assert fields - {"run_id"} == model
    assert set(_RECORD_COLUMNS) == model | {"run_id"}
    assert set(RECORD_TYPES) == fields


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["analysed", "approved", "rejected", "revoked"])
def test_the_servers_timings_never_change_the_records_of_a_decided_experiment(status: str) -> None:
    experiment = make_experiment()
    run = experiment.runs.first()
    records_ingest(run_pk=run.pk, records=[observed(str(run.run_id), 0)])
    Experiment.objects.filter(pk=experiment.pk).update(status=status)
    with pytest.raises(RunsRefused, match=f"experiment {experiment.pk} is {status}"):
        records_server_timings_ingest(run_pk=run.pk, records=[_with_timings(observed(str(run.run_id), 0), 0)])
    assert RequestRecord.objects.get(run=run).server_e2e_ns is None
