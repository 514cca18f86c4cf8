"""What a replay is asked to do: :class:`ReplayConfig`, the one argument of
:func:`workers.replay.run.run_replay` besides the requests and the caller's hooks.

Pure: no Django, plain values only, so a worker, the ``replay`` command, the benches and the tests
build the same object. Its checks run when it is built: a bad value is a ``ValueError`` naming
the parameter before anything starts. :meth:`ReplayConfig.client_options` is what one send loop
takes (:class:`workers.replay.client._Replay`), the same JSON mapping a child process receives
(:mod:`workers.replay.shard`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from workers.replay.request import ENDPOINTS


class RehearsalOptions(TypedDict):
    """A recovery rehearsal's client (:mod:`workers.replay.rehearsal_client`): JSON, it crosses into the
    replay's own process."""

    switch_at_s: float  # from the origin: requests planned at or after it go to B0 (or the router)
    cut_after_s: float  # after the switch: streams still open on the candidate are cut
    b0_url: str | None  # tailtune's own client; None with the operator's router
    wait_for_b0: bool  # cold standby: hold post-switch requests until B0's /health answers 200
    backend_header: str | None  # router mode: the response header naming who answered


@dataclass(frozen=True)
class ReplayConfig:
    """Where to send, the trace's windows, and how the load generator runs.

    ``isolated`` runs the replay in a child process (``python -m workers.replay.shard``) so the
    caller's own work (database writes, scrapes) cannot stall its loop: how a worker runs every
    replay. ``processes > 1`` spreads the requests round-robin over that many children, for rates
    one event loop cannot keep on schedule. ``rehearsal`` makes it a recovery rehearsal's client
    (one process, no concurrency cap).
    """

    base_url: str
    model: str
    run_id: str
    warmup_s: float
    observation_s: float
    drain_deadline_s: float
    # p99 dispatch lag above which the run is invalid (the load generator fell behind).
    max_dispatch_lag_ms: float
    endpoint: str = "completions"
    # Client-side cap on open streams (waits are reported as admission delay); None: no cap.
    max_concurrency: int | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float | None = None
    # Fields every request body carries besides its own (the sampling settings).
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    output_mode: str = "exact"
    # How often ``on_batch`` receives the records finished since its last call.
    batch_interval_s: float = 1.0
    processes: int = 1
    isolated: bool = False
    rehearsal: RehearsalOptions | None = None

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, not {self.endpoint!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1 (or None for no cap)")
        if self.processes < 1:
            raise ValueError("processes must be >= 1")
        if self.rehearsal is not None and (self.processes > 1 or self.max_concurrency is not None):
            raise ValueError("a rehearsal runs in one process with no concurrency cap")

    def client_options(self) -> dict[str, Any]:
        """One send loop's keyword arguments (:class:`workers.replay.client._Replay`), JSON-ready."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "run_id": self.run_id,
            "warmup_s": self.warmup_s,
            "observation_s": self.observation_s,
            "drain_deadline_s": self.drain_deadline_s,
            "endpoint": self.endpoint,
            "max_concurrency": self.max_concurrency,
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "extra_body": dict(self.extra_body),
            "output_mode": self.output_mode,
        }
