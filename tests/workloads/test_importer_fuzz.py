"""Any bytes given to a trace importer end in a line-numbered error or a trace, never an exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.workloads.importers import AZURE_HEADER, FORMATS, TraceImportError, parse_trace_bytes
from apps.workloads.tracefile import TraceFormatError, trace_loads

numbers = st.one_of(
    st.integers(-(10**25), 10**25).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="0123456789.-e+ :T", max_size=12),
)
azure_rows = st.lists(
    st.tuples(st.text(alphabet="0123456789-: .+", max_size=30), numbers, numbers).map(",".join), max_size=8
).map(lambda rows: (AZURE_HEADER + "\n" + "\n".join(rows)).encode())
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
jsonl_rows = st.lists(
    st.dictionaries(
        st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "arrival_time", "x"]),
        json_values,
        max_size=5,
    ).map(json.dumps),
    max_size=6,
).map(lambda rows: "\n".join(rows).encode())
anything = st.one_of(st.binary(max_size=400), azure_rows, jsonl_rows)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=anything, fmt=st.sampled_from(FORMATS))
def test_it_gives_a_trace_or_a_line_numbered_error(data: bytes, fmt: str) -> None:
    try:
        trace = parse_trace_bytes(data, fmt=fmt)
    except TraceImportError as exc:
        assert str(exc)
    else:
        assert trace is not None


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=300), jsonl_rows))
def test_it_reads_a_canonical_trace_or_names_its_problem(data: bytes) -> None:
    try:
        trace_loads(data)
    except TraceFormatError as exc:
        assert str(exc)
