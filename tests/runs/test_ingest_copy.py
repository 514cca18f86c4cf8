"""records_ingest through the database's own path (COPY on Postgres, bulk_create on SQLite):
hostile strings stored exactly, and a retried batch longer than one COPY chunk (the ingest
sends a batch in chunks, apps/runs/ingest.py) written once, whichever chunk holds the rows
already stored."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.runs import ingest
from apps.runs.ingest import records_ingest
from apps.runs.models import RequestRecord
from tests.experiments.factories import make_experiment
from tests.runs.factories import observed
from tests.runs.test_copy_text import HOSTILE


def _hostile(run_id: str, i: int):
    rec = observed(run_id, i, cls=HOSTILE[i % len(HOSTILE)][:64])
    s = HOSTILE[(i + 3) % len(HOSTILE)]
    rec.error, rec.finish_reason, rec.backend, rec.error_kind = s, s[:32], s[::-1][:64], s[:16]
    return rec


def _stored(run) -> dict[int, tuple]:
    return {
        r.index: (r.request_class, r.error, r.finish_reason, r.backend, r.error_kind, r.token_gaps)
        for r in RequestRecord.objects.filter(run=run)
    }


def _expected(rec) -> tuple:
    return (
        rec.request_class,
        rec.error,
        rec.finish_reason,
        rec.backend,
        rec.error_kind,
        rec.token_gaps.to_json(),
    )


@pytest.mark.django_db(transaction=True)
def test_it_stores_hostile_strings_exactly_on_the_fast_path_and_the_fallback() -> None:
    run = make_experiment().runs.first()
    first = [_hostile(str(run.run_id), i) for i in range(len(HOSTILE))]
    assert records_ingest(run_pk=run.pk, records=first) == len(first)
    # A retry: every row of ``first`` again (the fallback's temporary table) and new hostile ones.
    more = [_hostile(str(run.run_id), i) for i in range(len(HOSTILE), 2 * len(HOSTILE))]
    assert records_ingest(run_pk=run.pk, records=first + more) == len(more)
    stored = _stored(run)
    assert stored == {rec.index: _expected(rec) for rec in first + more}
    assert stored[HOSTILE.index("\\N")][0] == "\\N"  # the NULL marker as a value stays a string


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stored_chunk", ["first", "last"])
def test_a_retried_batch_of_several_chunks_is_written_once(stored_chunk: str) -> None:
    run = make_experiment().runs.first()
    n = 2 * ingest._COPY_CHUNK + 7  # three chunks, the last one short
    batch = [observed(str(run.run_id), i) for i in range(n)]
    stored = batch[:5] if stored_chunk == "first" else batch[-5:]
    assert records_ingest(run_pk=run.pk, records=stored) == 5
    assert records_ingest(run_pk=run.pk, records=batch) == n - 5
    assert records_ingest(run_pk=run.pk, records=batch) == 0
    assert sorted(RequestRecord.objects.filter(run=run).values_list("index", flat=True)) == list(range(n))


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_fails_for_another_reason_leaves_nothing_behind() -> None:
    # A value the column refuses in the last chunk (a class longer than its 64 characters):
    # the whole batch is refused, the chunks before it included.
    if connection.vendor != "postgresql":
        pytest.skip("SQLite does not enforce a CharField's length")
    run = make_experiment().runs.first()
    batch = [observed(str(run.run_id), i) for i in range(2 * ingest._COPY_CHUNK)]
    batch[-1].request_class = "x" * 65
    with pytest.raises(Exception, match="too long"):
        records_ingest(run_pk=run.pk, records=batch)
    assert not RequestRecord.objects.filter(run=run).exists()
