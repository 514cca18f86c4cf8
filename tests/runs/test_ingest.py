from __future__ import annotations

import pytest

from apps.runs.ingest import metric_samples_ingest, records_ingest
from apps.runs.models import MetricSample, RequestRecord
from tests.experiments.factories import make_experiment
from tests.runs.factories import observed


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
