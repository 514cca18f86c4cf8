"""A done run's records packed once, so the report reads one row per run instead of every record.

What the report needs of a run's records is fixed once the run is done: its columns
(record_reader.Packed), its two gap histograms merged per class over its observation window, and
its stop reasons counted per class. ``digests_build`` packs them into a RunDigest row (the
pipeline calls it as a run finishes; ``report_records`` calls it for any run still without one:
a run finished before digests existed, a digest of an older ``VERSION``, or one dropped because a
record was written after it, apps/runs/ingest.py, or whose record count is no longer the run's).
``report_records`` then reads every run's digest and assembles exactly what reading the records
gives: the same table (classes coded as the record reader codes them, per batch of runs), the
same histograms and stop reasons (tests/analysis/test_run_digest.py compares both ways, and
bench/analysis/report_bench.py the whole report).

The records stay the evidence: a digest is derived from them, never edited, and can always be
thrown away and rebuilt.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from django.db import connection, transaction
from django.db.models import Count

from apps.analysis.columns import RecordTable
from apps.analysis.metrics import run_window
from apps.analysis.record_reader import RUN_BATCH, Packed, load_packed, record_fields
from apps.analysis.report_inputs import StoredRun
from apps.runs.models import RequestRecord as RecordRow
from apps.runs.models import Run, RunDigest
from workers.replay.records import GapHistogram

# Bumped whenever what a digest holds or how it is read changes: an older digest is rebuilt.
VERSION = 1
GAP_COLUMNS = ("token_gaps", "chunk_gaps")

Histograms = dict[tuple[str, str], GapHistogram]  # (run key, class) -> merged histogram


@dataclass(frozen=True)
class ReportRecords:
    """What the report reads of its done runs' records."""

    table: RecordTable
    token_hists: Histograms
    chunk_hists: Histograms
    stop_reasons: dict[str, dict[str, dict[str, int]]]  # run key -> class -> finish reason -> requests


def report_records(run_inputs: Sequence[StoredRun]) -> ReportRecords:
    """The runs' records as the report reads them, from their digests (built first where missing)."""
    digests = _read(run_inputs)
    missing = [r for r in run_inputs if r["pk"] not in digests]
    if missing:
        digests_build(missing)
        digests.update(_read(missing))
    lost = [r["key"] for r in run_inputs if r["pk"] not in digests]
    if lost:  # a run deleted meanwhile: nothing to read is not the same as no records
        raise RuntimeError(f"no digest could be built for runs {', '.join(lost[:5])}")
    return _assemble(run_inputs, digests)


def run_digest_build(*, run_pk: int) -> int:
    """Pack one done run's digest (the pipeline's call as the run ends); 0 when it is not done."""
    run = Run.objects.filter(pk=run_pk, status=Run.Status.DONE).first()
    if run is None:
        return 0
    stored = {
        "pk": run.pk,
        "key": str(run.run_id),
        "warmup_s": run.warmup_seconds,
        "observation_s": run.observation_seconds,
        "drain_deadline_s": run.drain_deadline_seconds,
    }
    return digests_build([cast(StoredRun, stored)])


def records_read(run_inputs: Sequence[StoredRun]) -> ReportRecords:
    """What the report reads, from the records themselves (what a digest packs; the bench's and
    the tests' reference for the digests)."""
    packed, token, chunk, stops = _from_records(run_inputs)
    return ReportRecords(
        table=packed.table(run_inputs), token_hists=token, chunk_hists=chunk, stop_reasons=stops
    )


def _from_records(
    run_inputs: Sequence[StoredRun],
) -> tuple[Packed, Histograms, Histograms, dict[str, dict[str, dict[str, int]]]]:
    """Every record's columns, the gap histograms merged in SQL and the stop reasons counted in SQL."""
    token, chunk = (cohort_histograms(run_inputs, column) for column in GAP_COLUMNS)
    return load_packed(run_inputs), token, chunk, stop_reasons(run_inputs)


def digests_build(run_inputs: Sequence[StoredRun]) -> int:
    """Pack each run's records into its RunDigest (replacing one of another version); returns how
    many were written. Read in one pass per batch of runs, as the report used to read them."""
    written = 0
    for lo in range(0, len(run_inputs), RUN_BATCH * 4):
        runs = list(run_inputs[lo : lo + RUN_BATCH * 4])
        packed, token, chunk, stops = _from_records(runs)
        rows = []
        order = np.argsort(packed.columns["run"], kind="stable")  # each run's rows in the order read
        bounds = np.searchsorted(packed.columns["run"][order], np.arange(len(runs) + 1))
        for code, run in enumerate(runs):
            mine = order[bounds[code] : bounds[code + 1]]
            blob, names = _pack(packed, mine)
            key = run["key"]
            rows.append(
                RunDigest(
                    run_id=run["pk"],
                    version=VERSION,
                    records=int(mine.size),
                    columns=blob,
                    class_names=names,
                    token_gaps=_hists_json(token, key),
                    chunk_gaps=_hists_json(chunk, key),
                    stop_reasons=stops.get(key, {}),
                )
            )
        with transaction.atomic():
            RunDigest.objects.filter(run_id__in=[r["pk"] for r in runs]).delete()
            # Two reports packing the same run at once: the second's rows are the same, and ignored.
            RunDigest.objects.bulk_create(rows, batch_size=16, ignore_conflicts=True)
        written += len(rows)
    return written


def _pack(packed: Packed, rows: np.ndarray) -> tuple[bytes, list[str]]:
    """One run's rows of ``packed`` as an ``np.savez`` blob, its classes coded by their position
    in the run's own sorted class names."""
    codes = packed.columns["cls"][rows]
    present = np.unique(codes)
    names = sorted(packed.class_names[int(c)] for c in present)
    local = np.full(len(packed.class_names), -1, dtype=np.int16)
    for c in present:
        local[int(c)] = names.index(packed.class_names[int(c)])
    arrays = {name: packed.columns[name][rows] for name in ("error_kind", *packed.fields)}
    arrays["cls"] = local[codes]
    return pack_arrays(arrays), names


def pack_arrays(arrays: dict[str, np.ndarray]) -> bytes:
    """One-dimensional arrays as bytes: a 4-byte length, a JSON list of [name, dtype, size], then
    each array's raw bytes in that order. np.savez's zip container and header parsing cost more
    than the copy itself at a run's size."""
    header = json.dumps([[name, a.dtype.str, int(a.size)] for name, a in arrays.items()]).encode()
    return b"".join(
        [
            len(header).to_bytes(4, "little"),
            header,
            *(np.ascontiguousarray(a).tobytes() for a in arrays.values()),
        ]
    )


def unpack_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays pack_arrays packed (read-only views of ``blob``); ValueError when it is not one."""
    if len(blob) < 4:
        raise ValueError("a packed digest is at least 4 bytes")
    size = int.from_bytes(blob[:4], "little")
    at = 4 + size
    out = {}
    try:
        header = json.loads(blob[4:at])
        for name, dtype, count in header:
            dt = np.dtype(dtype)
            if (
                not isinstance(count, int)
                or count < 0
                or dt.hasobject
                or at + dt.itemsize * count > len(blob)
            ):
                raise ValueError(f"packed digest column {name} does not fit its blob")
            out[str(name)] = np.frombuffer(blob, dtype=dt, count=count, offset=at)
            at += dt.itemsize * count
    except (TypeError, ValueError) as exc:  # not JSON, not triples, not a dtype: not ours
        raise ValueError(f"not a packed digest: {exc}") from exc
    if at != len(blob):
        raise ValueError("a packed digest holds bytes after its last column")
    return out


def _hists_json(hists: Histograms, key: str) -> dict[str, list[list[float]]]:
    """A run's merged histograms per class: [bucket, weight] pairs in bucket order."""
    return {
        cls: [[b, w] for b, w in sorted(h.counts.items())]
        for (k, cls), h in sorted(hists.items())
        if k == key
    }


@dataclass(frozen=True)
class _Digest:
    records: int
    arrays: dict[str, np.ndarray]
    class_names: list[str]
    token_gaps: dict[str, list[list[float]]]
    chunk_gaps: dict[str, list[list[float]]]
    stop_reasons: dict[str, dict[str, int]]


def _read(run_inputs: Sequence[StoredRun]) -> dict[int, _Digest]:
    """The runs' current digests by run pk; one of another version, or whose columns are not the
    ones this code reads, counts as missing."""
    fields = record_fields()
    want = {"cls", "error_kind", *fields}
    out: dict[int, _Digest] = {}
    pks = [r["pk"] for r in run_inputs]
    counts = _record_counts(pks)
    for pk, records, blob, names, token, chunk, stops in _rows(pks=pks):
        if counts.get(pk, 0) != records:  # a record added or deleted behind the digest's back
            continue
        try:
            arrays = unpack_arrays(bytes(blob))
        except ValueError:
            continue
        if set(arrays) != want or any(a.shape != (records,) for a in arrays.values()):
            continue
        out[pk] = _Digest(records, arrays, list(names), token, chunk, stops)
    return out


def _record_counts(pks: list[int]) -> dict[int, int]:
    """How many records each run holds now: one index-only count (about 0.1 s for a million), so a
    digest that no longer packs every record is never read, however the records changed."""
    if not pks:
        return {}
    qn = connection.ops.quote_name
    table = qn(RecordRow._meta.db_table)
    marks = ", ".join(["%s"] * len(pks))
    with connection.cursor() as cursor:
        # Identifiers come from the model's metadata; the run ids are parameters.
        cursor.execute(f"SELECT run_id, COUNT(*) FROM {table} WHERE run_id IN ({marks}) GROUP BY run_id", pks)  # noqa: S608
        return {int(pk): int(n) for pk, n in cursor.fetchall()}


def _rows(*, pks: list[int]) -> list[tuple[Any, ...]]:
    """The current digests' fields. On Postgres in binary: the columns' bytes travel as they are
    (the text protocol doubles them as hex; 0.27 s against 0.68 s on the seed sweep's 136 MB)."""
    fields = ("run_id", "records", "columns", "class_names", "token_gaps", "chunk_gaps", "stop_reasons")
    if connection.vendor != "postgresql":
        return list(RunDigest.objects.filter(run_id__in=pks, version=VERSION).values_list(*fields))
    import psycopg  # Postgres only

    qn = connection.ops.quote_name
    table = qn(RunDigest._meta.db_table)
    connection.ensure_connection()
    # Django's cursors bind on the client, which psycopg cannot combine with binary results.
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            f"SELECT {', '.join(qn(f) for f in fields)} FROM {table} WHERE run_id = ANY(%s) AND version = %s",  # noqa: S608 - names are ours
            [pks, VERSION],
            binary=True,
        )
        return cursor.fetchall()


def _assemble(run_inputs: Sequence[StoredRun], digests: dict[int, _Digest]) -> ReportRecords:
    """The table, histograms and stop reasons from the runs' digests, classes coded as
    record_reader codes them: per batch of RUN_BATCH runs in the runs' order, the batch's class
    names in sorted order, each new name the next code."""
    fields = record_fields()
    class_code: dict[str, int] = {}
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for lo in range(0, len(run_inputs), RUN_BATCH):
        batch = run_inputs[lo : lo + RUN_BATCH]
        for name in sorted({n for r in batch for n in digests[r["pk"]].class_names}):
            class_code.setdefault(name, len(class_code))
        for i, run in enumerate(batch, start=lo):
            d = digests[run["pk"]]
            codes = np.asarray([class_code[n] for n in d.class_names], dtype=np.int64)
            parts["run"].append(np.full(d.records, i, dtype=np.int64))
            parts["cls"].append(
                codes[d.arrays["cls"].astype(np.int64)] if d.records else np.zeros(0, np.int64)
            )
            for name in ("error_kind", *fields):
                parts[name].append(d.arrays[name])
    columns = {
        name: np.concatenate(parts[name])
        if parts[name]
        else np.zeros(0, dtype=np.int16 if name == "error_kind" else np.int64)
        for name in ("run", "cls", "error_kind", *fields)
    }
    packed = Packed(columns=columns, class_names=list(class_code), fields=fields)
    token: Histograms = {}
    chunk: Histograms = {}
    stops: dict[str, dict[str, dict[str, int]]] = {}
    for run in run_inputs:
        d = digests[run["pk"]]
        for out, stored in ((token, d.token_gaps), (chunk, d.chunk_gaps)):
            for cls, pairs in stored.items():
                out[(run["key"], cls)] = GapHistogram({int(b): float(w) for b, w in pairs})
        if d.stop_reasons:
            stops[run["key"]] = {cls: dict(by) for cls, by in d.stop_reasons.items()}
    return ReportRecords(
        table=packed.table(run_inputs), token_hists=token, chunk_hists=chunk, stop_reasons=stops
    )


def stop_reasons(run_inputs: Sequence[StoredRun]) -> dict[str, dict[str, dict[str, int]]]:
    """run key -> class -> finish_reason ("none" when the stream gave none) -> requests, warm-up
    requests left out: what the model did with the length it was allowed."""
    keys = {r["pk"]: r["key"] for r in run_inputs}
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    rows = (
        RecordRow.objects.filter(run_id__in=list(keys), warmup=False, sent=True)
        .values_list("run_id", "request_class", "finish_reason")
        .annotate(n=Count("id"))
    )
    for run_pk, cls, reason, n in rows:
        out[keys[run_pk]][cls][reason or "none"] = n
    return {k: dict(v) for k, v in out.items()}


def cohort_histograms(run_inputs: Sequence[StoredRun], column: str) -> Histograms:
    """Merge one gap-histogram column per (run, class) cohort inside the database.

    One query per distinct observation window (usually one for the whole
    experiment), grouped by run, class and bucket.
    """
    if column not in GAP_COLUMNS:
        raise ValueError(column)
    qn = connection.ops.quote_name
    table = qn(RecordRow._meta.db_table)
    col = qn(column)
    if connection.vendor == "postgresql":
        each = f"jsonb_each(r.{col}) AS j"
        value = "CAST(j.value AS double precision)"
    else:
        each = f"json_each(r.{col}) AS j"
        value = "j.value"
    by_window: dict[tuple[int, int], list[StoredRun]] = defaultdict(list)
    for run in run_inputs:
        w = run_window(run)
        by_window[(w.start_ns, w.end_ns)].append(run)
    out: Histograms = {}
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The planner's estimate for a set-returning function over a million
            # rows triggers JIT compilation and a sort-based aggregate; neither
            # pays off here (measured in bench/results/analysis.md).
            cursor.execute("SET LOCAL jit = off")
            cursor.execute("SET LOCAL work_mem = '64MB'")
        for (start, end), runs in sorted(by_window.items()):
            key_of = {run["pk"]: run["key"] for run in runs}
            marks = ", ".join(["%s"] * len(key_of))
            # Only identifiers from the model's own metadata are interpolated; every value is a parameter.
            sql = (
                f"SELECT r.run_id, r.request_class, j.key, SUM({value}) FROM {table} AS r, {each} "  # noqa: S608
                f"WHERE r.run_id IN ({marks}) AND r.warmup = %s AND r.planned_ns >= %s AND r.planned_ns < %s "
                "GROUP BY r.run_id, r.request_class, j.key"
            )
            cursor.execute(sql, [*key_of, False, start, end])
            for run_pk, cls, bucket, weight in cursor.fetchall():
                h = out.setdefault((key_of[run_pk], cls), GapHistogram())
                h.counts[int(bucket)] = h.counts.get(int(bucket), 0.0) + float(weight)
    return out
