"""Scrape vLLM's /metrics into typed samples, and take counter deltas that survive restarts.

Samples are plain dicts with the fields of ``apps.runs.models.MetricSample``
(``t_ns, taken_at, phase, epoch, name, labels, kind, value, histogram``), so the
ingest can bulk-create them directly; nothing here imports Django.

``epoch`` counts server restarts seen by one Scraper: a counter lower than in
the previous scrape (or a counter whose ``_created`` timestamp changed) means
the process behind the port is new, and every later sample gets the next
epoch. Deltas are only ever taken inside one epoch.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = (
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:admission_rejections_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
# Queue, TTFT and prefill time: the per-run split of TTFT where no per-request span joined
# (apps/analysis/ttft_parts.py).
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
)
INFOS = ("vllm:cache_config_info",)
DEFAULT_NAMES = frozenset(COUNTERS + GAUGES + HISTOGRAMS + INFOS)

PHASES = ("before", "during", "after")


def _le(value: str) -> float | str:
    # JSON has no infinity: the +Inf bucket keeps its Prometheus spelling.
    number = float(value)
    return "+Inf" if math.isinf(number) else number


def parse_metrics(text: str, *, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Parse Prometheus text into samples (no t_ns/phase/epoch yet).

    One sample per series: counters by their ``_total`` name, gauges, one
    histogram per label set (``value`` is its count; ``histogram`` holds
    cumulative ``[le, count]`` buckets, sum and count), and ``*_info`` gauges
    as ``kind="info"`` with the information in ``labels``. ``_created``
    series are dropped here; see :func:`parse_created`.
    """
    keep = None if names is None else set(names)
    out: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue
        if family.type == "counter":
            for s in family.samples:
                if s.name.endswith("_total") and (keep is None or s.name in keep):
                    out.append(
                        {"name": s.name, "labels": dict(s.labels), "kind": "counter", "value": s.value}
                    )
        elif family.type == "histogram":
            if keep is not None and family.name not in keep:
                continue
            series: dict[tuple, dict[str, Any]] = {}
            for s in family.samples:
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                key = tuple(sorted(labels.items()))
                entry = series.setdefault(key, {"labels": labels, "buckets": [], "sum": None, "count": None})
                if s.name.endswith("_bucket"):
                    entry["buckets"].append([_le(s.labels["le"]), s.value])
                elif s.name.endswith("_sum"):
                    entry["sum"] = s.value
                elif s.name.endswith("_count"):
                    entry["count"] = s.value
            for entry in series.values():
                entry["buckets"].sort(key=lambda b: math.inf if b[0] == "+Inf" else b[0])
                out.append(
                    {
                        "name": family.name,
                        "labels": entry["labels"],
                        "kind": "histogram",
                        "value": entry["count"],
                        "histogram": {
                            "buckets": entry["buckets"],
                            "sum": entry["sum"],
                            "count": entry["count"],
                        },
                    }
                )
        elif family.type in ("gauge", "info", "untyped"):
            for s in family.samples:
                if keep is not None and s.name not in keep:
                    continue
                kind = "info" if s.name.endswith("_info") else "gauge"
                out.append({"name": s.name, "labels": dict(s.labels), "kind": kind, "value": s.value})
    for sample in out:
        sample.setdefault("histogram", None)
    return out


def parse_created(text: str) -> dict[tuple[str, tuple], float]:
    """Counter creation timestamps: (counter ``_total`` name, sorted labels) -> created."""
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                base = s.name[: -len("_created")] + "_total"
                out[(base, tuple(sorted(s.labels.items())))] = s.value
    return out


def series_key(sample: Mapping[str, Any]) -> tuple[str, tuple]:
    return sample["name"], tuple(sorted(sample["labels"].items()))


class Scraper:
    """Scrape one server's /metrics before, during (every ``interval_s``, in a thread) and after a window.

    Usage::

        scraper = Scraper(base_url)
        scraper.scrape("before")
        scraper.start_during()      # background thread
        ...                          # the measured window
        scraper.stop_during()
        scraper.scrape("after")
        rows = scraper.samples       # MetricSample-shaped dicts

    A failed scrape is counted in ``errors`` (the server may be dying; the
    run's own checks decide that), never raised from the thread.
    """

    def __init__(
        self,
        base_url: str,
        *,
        interval_s: float = 2.0,
        names: Iterable[str] | None = DEFAULT_NAMES,
        client: httpx.Client | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.names = None if names is None else frozenset(names)
        self._client = client or httpx.Client(timeout=timeout_s)
        self._owns_client = client is None
        self.clock = clock
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.epoch = 0
        self.restarts: list[int] = []  # t_ns of each restart boundary seen
        self.taken_ns: list[int] = []  # t_ns of each scrape ingested (a failed one leaves a gap)
        # t_ns of the first and the latest scrape tried, ingested or not.
        self.first_attempt_ns: int | None = None
        self.last_attempt_ns: int | None = None
        self._last: dict[tuple[str, tuple], float] = {}
        self._created: dict[tuple[str, tuple], float] = {}
        self._lock = threading.Lock()
        # One fetch at a time, ingested before the next starts: two scrapes in flight at once
        # (the timed thread and a caller's own) could otherwise be ingested out of order, and a
        # counter read earlier but ingested later looks like a restart (a false new epoch).
        self._fetch_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ingest(self, text: str, phase: str, *, t_ns: int | None = None) -> list[dict[str, Any]]:
        """Add one scrape's text as samples of ``phase``; detect a restart first."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES} (got {phase!r})")
        t_ns = self.clock() if t_ns is None else t_ns
        parsed = parse_metrics(text, names=self.names)
        created = parse_created(text)
        with self._lock:
            restarted = any(
                s["kind"] == "counter"
                and series_key(s) in self._last
                and s["value"] < self._last[series_key(s)]
                for s in parsed
            ) or any(key in self._created and self._created[key] != value for key, value in created.items())
            if restarted:
                self.epoch += 1
                self.restarts.append(t_ns)
                self._last.clear()
            self._created.update(created)
            self.taken_ns.append(t_ns)
            taken_at = datetime.now(UTC)
            rows = []
            for s in parsed:
                if s["kind"] == "counter":
                    self._last[series_key(s)] = s["value"]
                if (
                    s["kind"] == "info"
                    and phase != "before"
                    and any(r["name"] == s["name"] and r["epoch"] == self.epoch for r in self.samples)
                ):
                    continue  # configuration info once per epoch is enough
                rows.append({"t_ns": t_ns, "taken_at": taken_at, "phase": phase, "epoch": self.epoch, **s})
            self.samples.extend(rows)
        return rows

    def gap_max_s(self) -> float | None:
        """The longest time the server went unobserved, in seconds: the largest interval between
        two scrapes ingested, counting the first and the latest scrape tried as bounds (so scrapes
        that all failed are one gap as long as the attempts). A stalled scraper and failing
        scrapes both show; None before two scrapes were tried or ingested."""
        with self._lock:
            bounds = (self.first_attempt_ns, self.last_attempt_ns)
            times = sorted({*self.taken_ns, *(t for t in bounds if t is not None)})
        if len(times) < 2:
            return None
        return round(max(b - a for a, b in zip(times, times[1:], strict=False)) / 1e9, 3)

    def scrape(self, phase: str) -> list[dict[str, Any]]:
        """Fetch /metrics once and ingest it; raises httpx errors (unlike the thread)."""
        with self._fetch_lock:
            t_ns = self.clock()
            with self._lock:
                if self.first_attempt_ns is None:
                    self.first_attempt_ns = t_ns
                self.last_attempt_ns = t_ns
            response = self._client.get(self.url)
            response.raise_for_status()
            return self.ingest(response.text, phase, t_ns=t_ns)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.scrape("during")
            except httpx.HTTPError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def start_during(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the during-scrape thread is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()

    def stop_during(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 10)
            self._thread = None

    def close(self) -> None:
        self.stop_during()
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def counter_deltas(samples: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per counter series and epoch: first and last value seen and their difference.

    Never merged across epochs, so never negative: a restarted server's counts
    appear as a separate entry with the next epoch.
    """
    spans: dict[tuple[str, tuple, int], dict[str, Any]] = {}
    for s in sorted((s for s in samples if s["kind"] == "counter"), key=lambda s: s["t_ns"]):
        key = (*series_key(s), s["epoch"])
        span = spans.get(key)
        if span is None:
            spans[key] = {
                "name": s["name"],
                "labels": dict(s["labels"]),
                "epoch": s["epoch"],
                "first": s["value"],
                "last": s["value"],
                "first_t_ns": s["t_ns"],
                "last_t_ns": s["t_ns"],
            }
        else:
            span["last"], span["last_t_ns"] = s["value"], s["t_ns"]
    for span in spans.values():
        span["delta"] = span["last"] - span["first"]
    return list(spans.values())


def counter_delta(
    samples: Iterable[Mapping[str, Any]], name: str, *, labels: Mapping[str, str] | None = None
) -> float | None:
    """The total increase of counter ``name`` (summed over its label sets, filtered by ``labels``).

    None if the counter was never seen, or if the server restarted while it
    was scraped (the counts of two processes are not one delta).
    """
    spans = [
        s
        for s in counter_deltas(samples)
        if s["name"] == name and all(s["labels"].get(k) == v for k, v in (labels or {}).items())
    ]
    if not spans or len({s["epoch"] for s in spans}) > 1:
        return None
    return sum(s["delta"] for s in spans)


def gauge_series(samples: Iterable[Mapping[str, Any]], name: str) -> list[tuple[int, str, int, float]]:
    """(t_ns, phase, epoch, value) of a gauge, summed over label sets per scrape, in time order."""
    by_t: dict[tuple[int, str, int], float] = {}
    for s in samples:
        if s["name"] == name and s["kind"] == "gauge":
            key = (s["t_ns"], s["phase"], s["epoch"])
            by_t[key] = by_t.get(key, 0.0) + float(s["value"])
    return [(t, phase, epoch, value) for (t, phase, epoch), value in sorted(by_t.items())]
