"""The replay's summary type says what :meth:`ReplayResult.summary` really holds."""

from __future__ import annotations

import dataclasses
import typing

from workers.replay.result import ReplayResult, ReplaySummary, summarise


def test_the_summary_type_declares_every_field_of_the_result_but_the_records() -> None:
    fields = [f.name for f in dataclasses.fields(ReplayResult) if f.name != "records"]
    assert list(typing.get_type_hints(ReplaySummary)) == fields
    assert ReplaySummary.__required_keys__ == frozenset(fields)


def test_a_summary_holds_exactly_the_declared_keys_in_their_order() -> None:
    class Finished:  # what summarise reads of a finished replay: here one that sent nothing
        run_id, records, stopped, notes = "r", [], False, ["n"]
        warmup_ns, observation_ns, extra_body, output_mode = 0, 1_000_000_000, {}, "exact"

    summary = summarise(Finished(), tolerance_ms=5.0, duration_s=1.0).summary()
    assert list(summary) == list(typing.get_type_hints(ReplaySummary))
    assert summary["notes"] == ["n"] and summary["rehearsal"] is None and summary["valid"] is True
