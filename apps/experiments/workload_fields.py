"""The workload's scalar fields, declared once: name, type, bounds, default, label and help.

A spec's ``workload`` section (docs/SPEC.md) holds the traffic's structure (mixtures, rates,
per-mixture rates, where the rates come from, the arrival process) and the scalars declared
here: the repeats and what they replay, how output lengths are sent, the seed, the three
windows, the load generator's tolerance, the uniform companion. Each consumer reads them from
:data:`WORKLOAD_FIELDS`:

- the spec checker (apps/experiments/spec_workload.py), through which every spec passes: the
  YAML upload, the create form, the API (``POST /api/v1/experiments``) and the gate;
- the create form (apps/experiments/forms.py) and the spec it builds (form_spec.py): the fields
  with ``form`` set, in this order, with their label, initial value, choices and help;
- the Workload row (apps/experiments/models.py takes its columns' defaults from here;
  services.experiment_create writes them) and the export (services.experiment_to_spec).

Two restatements stay, as their tools need them written out: the stored spec's type
(spec_types.Workload, for the type checker) and the model's columns (for migrations).
tests/experiments/test_workload_fields.py holds both to these declarations.

Pure: no Django.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.experiments.spec_rules import MAX_REPEATS, MAX_SEED, MAX_WINDOW_S

Scalar = int | float | str | bool


@dataclass(frozen=True)
class WorkloadField:
    name: str  # the key under ``workload:``, the Workload column and the form field
    kind: type[int] | type[float] | type[str] | type[bool]  # str: one of ``choices``
    # The column's default and the form's initial value; a number left out of a spec is an error,
    # a choice left out is its first, a flag left out is this.
    default: Scalar
    positive: bool = False
    minimum: float | None = None
    maximum: float | None = None
    # (value, what the form shows for it)
    choices: tuple[tuple[str, str], ...] = ()
    label: str | None = None  # the form's label; None: Django's, from the name
    help: str = ""
    form: bool = True  # the create form has a field for it (else only a YAML spec sets it)
    column: bool = True  # a column of the Workload row (else read from the stored spec)

    @property
    def values(self) -> tuple[str, ...]:
        """The choices' values, the first being the default."""
        return tuple(value for value, _ in self.choices)


WORKLOAD_FIELDS: tuple[WorkloadField, ...] = (
    WorkloadField("repeats", int, 3, positive=True, maximum=MAX_REPEATS),
    # same: every repeat replays the same frozen traces (repeat variation is then the server's);
    # fresh: each repeat gets its own draw from the seed (traffic variation included).
    WorkloadField(
        "repeat_traces",
        str,
        "same",
        choices=(
            ("same", "same: every repeat replays the same frozen traces"),
            ("fresh", "fresh: each repeat draws its own traffic from the seed"),
        ),
        label="Repeats replay",
    ),
    # exact forces every request's length (ignore_eos, min_tokens); natural sends the length as a
    # cap only and records what the model did (length, finish_reason).
    WorkloadField(
        "output_mode",
        str,
        "exact",
        choices=(
            ("exact", "exact: every request decodes exactly its output tokens"),
            ("natural", "natural: output tokens are a cap; the model stops where it stops"),
        ),
        label="Output lengths",
    ),
    WorkloadField("seed", int, 0, minimum=0, maximum=MAX_SEED, label="Workload seed"),
    WorkloadField("warmup_s", float, 10, minimum=0.0, maximum=MAX_WINDOW_S, label="Warm-up (s)"),
    WorkloadField(
        "observation_s", float, 120, positive=True, maximum=MAX_WINDOW_S, label="Observation window (s)"
    ),
    WorkloadField(
        "drain_deadline_s", float, 60, positive=True, maximum=MAX_WINDOW_S, label="Drain deadline (s)"
    ),
    WorkloadField(
        "max_dispatch_lag_ms",
        float,
        5,
        positive=True,
        maximum=MAX_WINDOW_S * 1000,
        label="Dispatch-lag tolerance (ms)",
        help="How late the load generator may send a request (p99 of send time minus planned time) "
        "before the run is invalid: later than this, the offered load was not the planned one. A few ms "
        "on a quiet client machine; more where the client shares CPUs with the engine.",
    ),
    # Also replay each (cell, mixture, rate) once on constant spacing: uniform vs bursty.
    WorkloadField("uniform_companion", bool, False, form=False, column=False),
)
WORKLOAD_FIELD = {f.name: f for f in WORKLOAD_FIELDS}
FORM_WORKLOAD_FIELDS = tuple(f for f in WORKLOAD_FIELDS if f.form)
COLUMN_WORKLOAD_FIELDS = tuple(f for f in WORKLOAD_FIELDS if f.column)

# The section's structure, checked by its own code in spec_workload.py, and its scalars.
WORKLOAD_STRUCTURE = ("mixtures", "rates", "mixture_rates", "rates_source", "arrival", "prompts")
WORKLOAD_KEYS = frozenset({*WORKLOAD_STRUCTURE, *WORKLOAD_FIELD})
REPEAT_TRACES = WORKLOAD_FIELD["repeat_traces"].values
OUTPUT_MODES = WORKLOAD_FIELD["output_mode"].values
