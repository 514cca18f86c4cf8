"""A record's stored form: every field, in field order, the histograms as their counts."""

from __future__ import annotations

import dataclasses
import json

from workers.replay.records import GapHistogram, RequestRecord


def test_a_record_serialises_to_what_dataclasses_asdict_gives_and_back() -> None:
    record = RequestRecord(
        run_id="r", index=7, request_class="short", warmup=False, input_tokens=128,
        expected_output_tokens=32, planned_ns=5_000, sent_ns=5_100, admission_delay_ns=0,
        first_token_ns=60_000, last_token_ns=400_000, end_ns=401_000, output_tokens=32,
        prompt_tokens=128, chunks=31, max_gap_ns=12_000, http_status=200, finish_reason="length",
        priority=2, backend="b0",
    )  # fmt: skip
    record.token_gaps = GapHistogram({10_000: 30.0, 12_000: 1.0})
    record.chunk_gaps = GapHistogram({10_000: 31.0})
    expected = dataclasses.asdict(record)
    expected["chunk_gaps"] = record.chunk_gaps.to_json()
    expected["token_gaps"] = record.token_gaps.to_json()
    data = record.to_json()
    # The same keys in the same order, the same values: the stored JSON is byte-identical.
    assert json.dumps(data) == json.dumps(expected)
    assert RequestRecord.from_json(json.loads(json.dumps(data))) == record
