"""The spec's vocabulary and bounds: the keys each section allows, the choices, the limits.

Pure: no Django. Constants only (and :class:`SpecLimits`, the caps on a whole plan), shared by
the validator's modules: apps/experiments/spec.py (the entry point, which re-exports every name
here), spec_checker.py, spec_cells.py, spec_workload.py, spec_sections.py and workload_fields.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apps.analysis.compare_options import PRIMARY_CHOICES

# Scheduler args a cell may vary, with their types. Everything else that
# shapes the server is a frozen control (same for every cell) or is refused.
CELL_ARGS: dict[str, type] = {
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "enable_chunked_prefill": bool,
    "scheduling_policy": str,
    "long_prefill_token_threshold": int,
    "max_num_queued_reqs": int,
}
SCHEDULING_POLICIES = ("fcfs", "priority")
ARRIVAL_PROCESSES = ("constant", "poisson", "gamma")
# Replay a stored imported trace (manage.py trace_import) instead of generating arrivals.
TRACE_PROCESS = "trace"
CONTROL_KEYS = {
    "dtype",
    "tensor_parallel_size",
    "max_model_len",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "enable_prefix_caching",
    "speculative_decoding",
    "seed",
    "generation",
}
# Sections every experiment has (the create form types each one), and the optional ones.
CORE_SECTIONS = frozenset(
    {
        "name",
        "description",
        "owner",
        "model",
        "controls",
        "engine",
        "baseline",
        "candidates",
        "classes",
        "workload",
    }
)
OPTIONAL_SECTIONS = frozenset({"scenarios", "calibration", "analysis", "recovery", "quality", "search"})
TOP_KEYS = CORE_SECTIONS | OPTIONAL_SECTIONS
# The workload section's keys and its scalars' choices: apps/experiments/workload_fields.py.


# A class's primary metric: the tail its gains are judged on (docs/ANALYSIS.md);
# left out, the short class is judged on TTFT and the long class on end-to-end latency.
PRIMARY_METRICS = PRIMARY_CHOICES

# Upper bounds of a spec (docs/SPEC.md, "Limits"), checked before anything expands, so a
# careless or hostile spec is a field error, never a plan the web process tries to build.
MAX_SPEC_BYTES = 1_000_000
MAX_YAML_DEPTH = 32
MAX_CELLS = 200
MAX_CLASSES = 50
MAX_MIXTURES = 20
MAX_RATES = 20
MAX_REPEATS = 100
MAX_WINDOW_S = 86_400.0  # any one window: warm-up, observation, drain
MAX_TOKENS = 1_048_576  # max_model_len and any token count
MAX_RATE_RPS = 100_000.0
MAX_LATENCY_MS = 86_400_000.0
MAX_SEED = 2**63 - 1
MAX_PRIORITY = 1_000_000
MAX_KV_BYTES = 2**50
MAX_PARALLEL = 1024
MAX_CV = 1000.0
# Anything else numeric: a value no setting of tailtune's needs.
NUMBER_CEILING = 1e15


# Start and stop of a server around each run (seconds): the plan's estimates and its cap.
RUN_OVERHEAD_S = 60.0


@dataclass(frozen=True)
class SpecLimits:
    """The caps on a whole plan and where its model may lie; the service reads them from settings
    (TAILTUNE_MAX_RUNS, TAILTUNE_MODEL_ROOTS, ...) and the hosts' rows."""

    max_runs: int = 10_000
    max_engine_hours: float = 2_000.0
    # Engine time a run costs beyond its windows (start, confirm, warm-up, stop).
    run_overhead_s: float = RUN_OVERHEAD_S
    # The directories ``model.path`` may lie under (TAILTUNE_MODEL_ROOTS of the service and of
    # its hosts; workers/engine/model_paths.py), a relative path starting at ``model_base_dir``.
    # None: no roots known here, so only the path's own form is checked ('..', control characters).
    model_roots: tuple[str, ...] | None = None
    model_base_dir: str = "/"


DEFAULT_LIMITS = SpecLimits()
CONTRACT_KEYS = ("ttft_p99_ms", "e2e_p99_ms", "max_stall_ms", "error_rate")
WEIGHT_TOLERANCE = 1e-6

CALIBRATION_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "start_rps": 1.0,
    "tolerance": 0.1,
    "max_steps": 8,
    "warmup_s": 2.0,
    "observation_s": 20.0,
    "drain_deadline_s": 15.0,
    "min_accepted_share": 0.99,
    "fractions": {"low": 0.3, "near_capacity": 0.9},
    "mixtures": None,
    # mixture: each mixture's rates are fractions of its own capacity;
    # experiment: one set of rates, fractions of the smallest capacity.
    "rates_per": "mixture",
}
RATES_PER = ("mixture", "experiment")
