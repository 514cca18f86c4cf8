"""The packed column reader (binary COPY on Postgres) gives the very table the row reader gives
(the same records in the same order; the tests sort both by run and index, as a plan may differ)."""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from apps.analysis import record_reader
from apps.analysis.columns import SCALAR_FIELDS, SERVER_FIELDS, RecordTable
from apps.analysis.services import _run_inputs
from apps.runs.models import RequestRecord as RecordRow
from tests.analysis.factories import done_experiment

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="binary COPY is Postgres's"),
    pytest.mark.allow_skip(reason="the packed reader is Postgres's; SQLite reads rows (CI runs Postgres)"),
]


def assert_same_table(a: RecordTable, b: RecordTable) -> None:
    """The same records in two tables: classes and runs coded alike, every column equal (dtype
    included) once both are sorted by run and index (the database's row order may differ)."""
    assert len(a) == len(b)
    assert a.class_names == b.class_names and a.run_keys == b.run_keys
    oa, ob = np.lexsort((a.index, a.run)), np.lexsort((b.index, b.run))
    for name in ("run", "cls", "error_kind", *SCALAR_FIELDS):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x[oa], y[ob], err_msg=name)
    for name in SERVER_FIELDS:
        np.testing.assert_array_equal(a.server(name)[oa], b.server(name)[ob], err_msg=name)


def test_the_packed_reader_reads_what_the_row_reader_reads():
    experiment, _ = done_experiment(per_run=40)
    records = RecordRow.objects.filter(run__experiment=experiment).order_by("id")
    ids = list(records.values_list("id", flat=True))
    # Every shape a value can take: no error, a known kind, an unknown kind ("other"), NULL
    # times, a server timing joined, a class name that sorts first.
    RecordRow.objects.filter(id=ids[0]).update(error_kind="timeout", first_token_ns=None, end_ns=None)
    RecordRow.objects.filter(id=ids[1]).update(error_kind="something-new", http_status=None)
    RecordRow.objects.filter(id=ids[2]).update(server_queue_ns=1_234_567, request_class="aaa", cancelled=True)
    runs = _run_inputs(list(experiment.runs.select_related("cell").order_by("plan_position", "id")))
    server = tuple(SERVER_FIELDS)
    packed = record_reader._load_packed(runs, server).table(runs)
    rows = record_reader._load_rows(runs, server).table(runs)
    assert len(packed) == len(ids)
    assert_same_table(packed, rows)
    assert "aaa" in packed.class_names
    assert set(packed.error_kind.tolist()) >= {-1, 2, 6}  # none, timeout, other
    assert np.isnan(packed.first_token_ns).any() and np.nanmax(packed.server("server_queue_ns")) == 1_234_567


def test_the_packed_reader_reads_runs_without_records():
    experiment, _ = done_experiment(per_run=5)
    RecordRow.objects.filter(run__experiment=experiment).delete()
    runs = _run_inputs(list(experiment.runs.select_related("cell")))
    table = record_reader._load_packed(runs, tuple(SERVER_FIELDS)).table(runs)
    assert len(table) == 0 and table.class_names == []
