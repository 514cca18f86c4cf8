"""A run's per-request server timings: the server's spans joined to the run's records, stored.

After a run's replay (workers/pipeline.py, step 4) :func:`run_server_spans` waits briefly for the
spans of the run's answered requests to reach the server's receiver, joins them to the records by
request id (workers/engine/spans.py), writes the ``server_*_ns`` timings onto the records already
stored (apps/runs/ingest.py ``records_server_timings_ingest``), and returns the run's
``summary["server_spans"]``.
"""

from __future__ import annotations

import logging

from apps.experiments.models import RunsRefused
from apps.runs.ingest import records_server_timings_ingest
from apps.runs.models import Run
from workers.engine.server import EngineServer
from workers.engine.spans import ServerSpansSummary, collect_run_spans, join_spans, spans_summary
from workers.replay.result import ReplayResult

log = logging.getLogger(__name__)


def run_server_spans(run: Run, server: EngineServer, result: ReplayResult) -> ServerSpansSummary:
    """Join the server's spans of this run to its records and store the timings; what the join
    covers. Evidence, not a precondition: a failure here leaves the records without server
    timings and the summary says why (a refused experiment still refuses, as every writer does)."""
    if server.spans is None:
        return spans_summary(None, off_reason=server.spans_off_reason)
    try:
        by_index = collect_run_spans(server.spans.store, str(run.run_id), result.records)
        join = join_spans(result.records, by_index)
        records_server_timings_ingest(run_pk=run.pk, records=result.records)
    except RunsRefused:
        raise
    except Exception as exc:  # the run's client measurements stand without them
        log.exception("run %s: joining the server's spans failed", run.pk)
        return spans_summary(
            None, off_reason=f"joining the server's spans failed ({type(exc).__name__}: {exc})"
        )
    return spans_summary(join)
