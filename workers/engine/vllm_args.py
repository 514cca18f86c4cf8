"""Every flag vLLM's own server parser accepts, checked and written without vLLM installed.

Pure: no Django, no vLLM. The catalogue is vLLM's ``vllm serve`` parser as the engine's own
interpreter describes it (workers/engine/vllm_parser_probe.py ``dump``), committed per vLLM
version under workers/engine/vllm_flags/; an engine test regenerates the pinned version's file
and fails if it differs, so a version bump cannot drift from what the service checks.

1. :func:`catalogue` loads one version's flags (default: :data:`PINNED_VERSION`, the version
   scripts/engine-setup.sh installs).
2. :data:`DENIED` names the flags a spec may never set, each with why: flags that load code or
   files from outside the host's model roots, reach another machine, or that tailtune's launcher
   sets itself (docs/SPEC.md, "Denied flags", lists them grouped).
3. :func:`check_arg` says what is wrong with one ``name: value`` (unknown, denied, wrong type or
   choice, unsafe text), or None; :func:`arg_argv` writes a checked one as argv items.
4. :func:`parse_serve_command` parses a ``vllm serve`` command line with vLLM's own parser, in
   the engine's interpreter (a subprocess: an argument list, never a shell).

Names are the parser's dests, snake_case as in the spec (``kv_cache_dtype``, ``block_size``).

Over 500 lines on purpose: most of it is the deny-list with each flag's reason, which is a
security boundary and reads best as one table beside the checks that apply it.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The vLLM version the CPU engine installs (scripts/engine-setup.sh, VLLM_SPEC; a test holds the
# two equal): the catalogue a spec is checked against.
PINNED_VERSION = "0.32.0"
FLAGS_DIR = Path(__file__).resolve().with_name("vllm_flags")
PROBE = Path(__file__).resolve().with_name("vllm_parser_probe.py")

# What a value written into argv may look like: no leading dash (argparse would read a flag), no
# whitespace, quote, shell or control character. The launcher's own controls use the same rule.
SAFE_STRING = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:/@+=,-]{0,199}$")
# A JSON-valued flag: written compact, at most this long, with no whitespace or control character.
MAX_JSON_CHARS = 8192
MAX_LIST_ITEMS = 256
# As any other number of a spec (docs/SPEC.md, "Limits").
NUMBER_CEILING = 1e15

# The types vLLM's parser gives flags that take JSON (vllm_parser_probe.JSON_TYPES).
_JSON_TYPES = frozenset({"loads", "parse_dataclass"})
_JSON_OR_STR_TYPES = frozenset({"union_dict_and_str"})
_INT_TYPES = frozenset({"int", "human_readable_int", "human_readable_int_or_auto"})


class UnknownVersion(LookupError):
    """No catalogue is committed for this vLLM version."""


@dataclass(frozen=True)
class Flag:
    """One action of vLLM's server parser (the probe's ``dump`` record)."""

    dest: str
    options: tuple[str, ...]
    action: str  # store | store_true | store_false | boolean_optional | append | ...
    type: str | None  # the converter's name: int, float, str, loads, parse_dataclass, ...
    optional: bool  # "None" / "" read as None
    nargs: str | int | None
    choices: tuple[Any, ...] | None
    default: Any
    suppressed_default: bool
    help: str

    @property
    def option(self) -> str:
        """The long option it is written with (``--kv-cache-dtype``)."""
        return next(o for o in self.options if o.startswith("--") and not o.startswith("--no-"))

    @property
    def is_list(self) -> bool:
        return self.nargs in ("+", "*") or self.action == "append"

    @property
    def kind(self) -> str:
        """bool | int | float | json | json_or_str | str: what one value (one item of a list) is."""
        if self.action in ("store_true", "store_false", "boolean_optional"):
            return "bool"
        if self.type in _INT_TYPES:
            return "int"
        if self.type == "float":
            return "float"
        if self.type in _JSON_TYPES:
            return "json"
        if self.type in _JSON_OR_STR_TYPES:
            return "json_or_str"
        return "str"

    def value_choices(self) -> tuple[Any, ...] | None:
        if self.choices is None:
            return None
        return tuple(c for c in self.choices if c is not None)


@dataclass(frozen=True)
class Catalogue:
    version: str
    flags: Mapping[str, Flag]

    def defaults(self) -> dict[str, Any]:
        """dest -> parser default, for every flag with one (vLLM logs an arg only when it differs)."""
        return {d: f.default for d, f in self.flags.items() if not f.suppressed_default}


def available_versions() -> list[str]:
    return sorted(p.stem.removeprefix("vllm-") for p in FLAGS_DIR.glob("vllm-*.json"))


def catalogue_path(version: str) -> Path:
    return FLAGS_DIR / f"vllm-{version}.json"


@functools.cache
def catalogue(version: str | None = None) -> Catalogue:
    """The committed flags of one vLLM version (default: the pinned one)."""
    version = version or PINNED_VERSION
    path = catalogue_path(version)
    if not re.fullmatch(r"[0-9A-Za-z.+_-]{1,64}", version) or not path.is_file():
        raise UnknownVersion(
            f"no flag catalogue for vLLM {version!r} (committed: {', '.join(available_versions()) or 'none'}); "
            "generate one with that version's interpreter: python workers/engine/vllm_parser_probe.py dump"
        )
    return catalogue_from_dump(json.loads(path.read_text()))


def catalogue_from_dump(doc: Mapping[str, Any]) -> Catalogue:
    flags: dict[str, Flag] = {}
    for item in doc["flags"]:
        if item["action"] == "help" or not item["options"]:
            continue  # --help, and the positional model (the launcher's)
        flags[item["dest"]] = Flag(
            dest=item["dest"],
            options=tuple(item["options"]),
            action=item["action"],
            type=item["type"],
            optional=bool(item["optional"]),
            nargs=item["nargs"],
            choices=None if item["choices"] is None else tuple(item["choices"]),
            default=item["default"],
            suppressed_default=bool(item.get("suppressed_default")),
            help=item.get("help") or "",
        )
    return Catalogue(version=str(doc["vllm_version"]), flags=flags)


# --- What a spec may not set ---------------------------------------------------------------------

_REMOTE_CODE = "runs Python code that comes with the model repository"
_IMPORTS = "imports Python code by name or from a file path"
_READS_FILE = "reads a file from a path on the host, outside the model roots"
_OWN = "is set by tailtune's launcher"
_NETWORK = "connects the server to another machine or address"

# Grouped as docs/SPEC.md lists them ("Denied flags"); a test holds the two equal.
DENIED_GROUPS: dict[str, dict[str, str]] = {
    "Code from outside tailtune's control": {
        "trust_remote_code": f"it {_REMOTE_CODE} (its configuration and modelling files)",
        "code_revision": f"it picks the revision of the code trust_remote_code would run ({_REMOTE_CODE})",
        "tool_parser_plugin": f"it {_IMPORTS} (a tool-call parser plugin)",
        "reasoning_parser_plugin": f"it {_IMPORTS} (a reasoning parser plugin)",
        "io_processor_plugin": "it loads an installed IO-processor plugin by name",
        "logits_processors": f"it {_IMPORTS} (logits processor classes)",
        "worker_cls": f"it {_IMPORTS} (the worker class)",
        "worker_extension_cls": f"it {_IMPORTS} (a worker extension class)",
        "scheduler_cls": f"it {_IMPORTS} (the scheduler class)",
        "middleware": f"it {_IMPORTS} (ASGI middleware for the server)",
        "model_class_overrides": f"it {_IMPORTS} (a module:class per architecture)",
        "ec_manager_config": f"it {_IMPORTS} (the encoder cache manager class)",
        "additional_config": "it is passed unchecked to platform plugins, whose meaning tailtune cannot check",
        "trust_request_chat_template": "it lets a request's body carry the chat template (Jinja) the server runs",
        "trust_request_mm_kwargs": (
            "it lets a request's body change how the server preprocesses media (vLLM: only for trusted clients)"
        ),
        "enable_prompt_embeds": "it lets a request's body carry tensors the server deserialises",
        "enable_mm_embeds": "it lets a request's body carry tensors the server deserialises",
    },
    "Files and paths outside the model roots": {
        "chat_template": f"it {_READS_FILE} (or takes a template's text); the model directory's own template is used",
        "tokenizer": f"it {_READS_FILE} (a tokenizer directory); the tokenizer is the model's (model.path)",
        "hf_config_path": f"it {_READS_FILE} (a model config directory)",
        "download_dir": "it names where weights are read and written, outside the model roots",
        "model_loader_extra_config": "it passes loader options that can name files and storage URIs",
        "allowed_local_media_path": "it lets requests read files from a host directory",
        "lora_modules": f"it {_READS_FILE} (LoRA adapters)",
        "default_mm_loras": f"it {_READS_FILE} (LoRA adapters)",
        "mm_encoder_fp8_scale_path": f"it {_READS_FILE} (encoder FP8 scales)",
        "mm_encoder_fp8_scale_save_path": "it writes a file to a path on the host",
        "profiler_config": "it writes profiler traces to a directory on the host",
        "log_config_file": f"it {_READS_FILE} (a logging configuration)",
        "config": f"it {_READS_FILE} (a YAML of more arguments)",
        "ssl_keyfile": f"it {_READS_FILE} (a TLS key); the replay speaks plain HTTP to the server",
        "ssl_certfile": f"it {_READS_FILE} (a TLS certificate); the replay speaks plain HTTP to the server",
        "ssl_ca_certs": f"it {_READS_FILE} (CA certificates); the replay speaks plain HTTP to the server",
    },
    "Other machines and addresses": {
        "tool_server": f"it {_NETWORK} (tool servers)",
        "kv_transfer_config": f"it {_NETWORK} and can import a connector module by path",
        "ec_transfer_config": f"it {_NETWORK} and can import a connector module by path",
        "kv_events_config": f"it {_NETWORK} (it publishes KV-cache events)",
        "weight_transfer_config": f"it {_NETWORK} (it receives weights)",
        "master_addr": f"it {_NETWORK}; tailtune runs one server on one host",
        "master_port": f"it {_NETWORK}; tailtune runs one server on one host",
        "nnodes": "it spans several nodes; tailtune runs one server on one host",
        "node_rank": "it spans several nodes; tailtune runs one server on one host",
        "data_parallel_address": f"it {_NETWORK}; tailtune runs one server on one host",
        "data_parallel_rpc_port": "it opens another port; tailtune runs one server on one host",
        "data_parallel_rank": "it makes this server one rank of a larger deployment",
        "data_parallel_start_rank": "it makes this server one rank of a larger deployment",
        "data_parallel_size_local": "it makes this server one rank of a larger deployment",
        "data_parallel_hybrid_lb": "it makes this server one rank of a larger deployment",
        "data_parallel_external_lb": "it makes this server one rank of a larger deployment",
        "data_parallel_multi_port_external_lb": "it opens one server per rank on ports of its own",
        "data_parallel_supervisor_port": "it opens another port; tailtune runs one server on one host",
        "hf_token": "it is a credential: the engine runs offline, and a spec is readable by every viewer",
        "watermark_config": "it holds a secret key (vLLM redacts it from its own log, so it cannot be confirmed)",
    },
    "Set by tailtune's launcher": {
        "model": f"it {_OWN} from model.path",
        "revision": f"it {_OWN} from model.revision",
        "tokenizer_revision": f"it {_OWN} from model.tokenizer_revision",
        "served_model_name": f"it {_OWN}",
        "host": f"it {_OWN} (the host's TAILTUNE_BIND_HOST)",
        "port": f"it {_OWN} (a free port per server)",
        "uds": f"it {_OWN}: the server listens on the host and port the replay reaches",
        "root_path": f"it {_OWN}: the replay reaches the server's own paths",
        "api_key": f"it {_OWN}: a spec is readable by every viewer, so no credential goes in one",
        "headless": f"it {_OWN}: the server answers HTTP on its port",
        "grpc": f"it {_OWN}: the server answers HTTP on its port",
        "grpc_port": f"it {_OWN}: the server answers HTTP on its port",
        "enable_ssl_refresh": f"it {_OWN}: the replay speaks plain HTTP to the server",
        "ssl_cert_reqs": f"it {_OWN}: the replay speaks plain HTTP to the server",
        "ssl_ciphers": f"it {_OWN}: the replay speaks plain HTTP to the server",
        "device_ids": f"it {_OWN} (the host's TAILTUNE_DEVICES)",
        "log_level": f"it {_OWN}: the confirmation reads vLLM's INFO log ('non-default args')",
        "logging_config": f"it {_OWN}: the confirmation reads vLLM's INFO log, and it can name a file",
        "disable_log_stats": f"it {_OWN}: it turns off the /metrics tailtune scrapes",
        "otlp_traces_endpoint": (
            f"it {_OWN}: the server traces each request to the worker's own receiver on loopback "
            f"(TAILTUNE_SERVER_SPANS); any other endpoint {_NETWORK}"
        ),
        "speculative_config": "speculative decoding is not supported (controls.speculative_decoding)",
        "spec_method": "speculative decoding is not supported (controls.speculative_decoding)",
        "spec_model": "speculative decoding is not supported (controls.speculative_decoding)",
        "spec_tokens": "speculative decoding is not supported (controls.speculative_decoding)",
    },
}
DENIED: dict[str, str] = {name: why for group in DENIED_GROUPS.values() for name, why in group.items()}

# Flags allowed with only some values: the others load code or files, or reach another machine.
ALLOWED_VALUES: dict[str, tuple[frozenset[str], str]] = {
    "generation_config": (frozenset({"auto", "vllm"}), "any other value is a directory read from the host"),
    "load_format": (
        frozenset({"auto", "pt", "safetensors"}),
        "other loaders read weights from elsewhere (storage URIs, tensorizer files) or run plugins",
    ),
    "distributed_executor_backend": (
        frozenset({"mp", "uni"}),
        "ray joins a cluster on other machines, and any other value imports a class",
    ),
    "data_parallel_backend": (frozenset({"mp"}), "ray joins a cluster on other machines"),
}
# Keys of a JSON-valued flag that are denied while the flag itself is allowed.
DENIED_KEYS: dict[str, dict[str, str]] = {
    "compilation_config": {
        "cache_dir": "it names a directory of compiled code the server loads",
        "debug_dump_path": "it writes files to a path on the host",
        "inductor_passes": "it imports functions by name",
        "inductor_compile_config": "it passes options unchecked to the compiler, some of which name files",
    },
    "structured_outputs_config": {
        "reasoning_parser_plugin": DENIED["reasoning_parser_plugin"],
    },
}


# --- Checking and writing one arg ----------------------------------------------------------------


def _number_problem(value: Any, kind: str) -> str | None:
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer (got {value!r})"
    elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"must be a number (got {value!r})"
    if abs(value) > NUMBER_CEILING:
        return f"must be at most {NUMBER_CEILING:g} in size (got {value!r})"
    return None


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=True, allow_nan=False)


def _json_problem(name: str, value: Any) -> str | None:
    if not isinstance(value, dict | list):
        return f"must be a mapping (written as JSON), got {value!r}"
    try:
        text = _json_text(value)
    except (TypeError, ValueError):
        return "must hold only JSON values (strings, numbers, true/false, null, lists, mappings)"
    if len(text) > MAX_JSON_CHARS:
        return f"is {len(text)} characters as JSON; at most {MAX_JSON_CHARS}"
    if re.search(r"\s", text):
        return "must hold no whitespace (it is written as one compact JSON argument)"
    denied = sorted(set(value) & set(DENIED_KEYS.get(name, {}))) if isinstance(value, dict) else []
    if denied:
        return f"key {denied[0]} is denied: {DENIED_KEYS[name][denied[0]]}"
    return None


def _value_problem(flag: Flag, value: Any) -> str | None:
    kind = flag.kind
    if value is None:
        return "must have a value (leave the flag out for vLLM's default)"
    if kind == "bool":
        return None if isinstance(value, bool) else f"must be true or false (got {value!r})"
    if kind in ("int", "float"):
        problem = _number_problem(value, kind)
    elif kind == "json":
        return _json_problem(flag.dest, value)
    elif kind == "json_or_str" and isinstance(value, dict):
        return _json_problem(flag.dest, value)
    elif not isinstance(value, str) or not SAFE_STRING.match(value):
        return (
            "must be a plain token of at most 200 characters (letters, digits, . _ : / @ + = , -; "
            f"not starting with -), got {value!r}"
        )
    else:
        problem = None
    if problem is not None:
        return problem
    choices = flag.value_choices()
    if choices is not None and value not in choices:
        shown = ", ".join(str(c) for c in choices)
        return f"must be one of {shown} (got {value!r})"
    return None


def check_arg(name: Any, value: Any, version: str | None = None) -> str | None:
    """What is wrong with ``name: value`` as a vLLM server arg, or None (the message names no path)."""
    cat = catalogue(version)
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,99}", name):
        if isinstance(name, str) and re.fullmatch(r"-{0,2}[A-Za-z][A-Za-z0-9_-]{0,99}", name):
            snake = name.lstrip("-").replace("-", "_").lower()
            if snake in cat.flags:
                return f"write vLLM flags in snake_case, as {snake}"
        return f"is not a vLLM flag name (flags are snake_case, like max_num_seqs), got {name!r}"
    if name in DENIED:
        return f"is denied: {DENIED[name]}"
    flag = cat.flags.get(name)
    if flag is None:
        close = difflib.get_close_matches(name, list(cat.flags), n=2)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"is not a flag of vLLM {cat.version}'s server{hint}"
    if flag.is_list:
        if not isinstance(value, list) or not value:
            return f"must be a non-empty list (got {value!r})"
        if len(value) > MAX_LIST_ITEMS:
            return f"has {len(value)} items; at most {MAX_LIST_ITEMS}"
        for i, item in enumerate(value):
            problem = _value_problem(flag, item)
            if problem is not None:
                return f"item {i} {problem}"
        return None
    problem = _value_problem(flag, value)
    if problem is None and name in ALLOWED_VALUES:
        allowed, why = ALLOWED_VALUES[name]
        if value not in allowed:
            return f"must be one of {', '.join(sorted(allowed))} (got {value!r}): {why}"
    return problem


def _item_text(flag: Flag, value: Any) -> str:
    if isinstance(value, dict | list):
        return _json_text(value)
    return str(value)


def arg_argv(name: str, value: Any, version: str | None = None) -> list[str]:
    """The argv items one checked arg is written as (``--flag=value``; ValueError if unchecked)."""
    problem = check_arg(name, value, version)
    if problem is not None:
        raise ValueError(f"{name}: {problem}")
    flag = catalogue(version).flags[name]
    option = flag.option
    if flag.kind == "bool":
        if flag.action == "boolean_optional":
            return [option if value else "--no-" + option[2:]]
        # store_true / store_false: only the value that differs from the default can be written.
        wanted = flag.action == "store_true"
        return [option] if value is wanted else []
    if flag.action == "append":
        return [f"{option}={_item_text(flag, item)}" for item in value]
    if flag.is_list:
        # Each item its own argument; none starts with '-' (checked), so none is read as a flag.
        return [option, *(_item_text(flag, item) for item in value)]
    return [f"{option}={_item_text(flag, value)}"]


# --- Parsing a `vllm serve` command line with vLLM's own parser ----------------------------------


class ServeParseError(ValueError):
    """The command line could not be parsed (the message says why, with vLLM's own words)."""


# Runs that reach the probe: hub and telemetry off, as every engine process here.
PROBE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.launchers.api_server.entry")
MAX_ARGV_ITEMS = 2000
MAX_ARGV_CHARS = 200_000


def serve_arguments(argv: list[str]) -> list[str]:
    """The arguments after the program: after ``vllm serve`` (or ``python -m vllm.entrypoints.cli.main
    serve``) or ``python -m <vLLM's server module>``; a list that names neither is taken as those
    arguments already."""
    for i, item in enumerate(argv):
        if item == "serve" and i >= 1 and Path(argv[i - 1]).name.startswith("vllm"):
            return argv[i + 1 :]
        if item == "-m" and i + 1 < len(argv) and argv[i + 1] in _SERVER_MODULES:
            return argv[i + 2 :]
    return list(argv)


def probe_environment() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    return {**base, **PROBE_ENV}


def run_probe(engine_python: str, probe_args: list[str], *, timeout_s: float) -> dict[str, Any]:
    """Run the probe in the engine's interpreter and return its JSON (ServeParseError otherwise)."""
    if not engine_python or not Path(engine_python).is_file():
        raise ServeParseError(
            f"the engine's interpreter {engine_python!r} does not exist (run `make engine`)"
        )
    with tempfile.TemporaryDirectory(prefix="tailtune-probe-") as cwd:
        try:
            done = subprocess.run(
                [engine_python, str(PROBE), *probe_args],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=probe_environment(),
                cwd=cwd,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ServeParseError(f"vLLM's parser did not answer within {timeout_s:g} s") from None
        except OSError as exc:
            raise ServeParseError(f"could not run the engine's interpreter {engine_python}: {exc}") from None
    stderr_tail = [line for line in done.stderr.splitlines() if line.strip()][-1:]
    if done.returncode != 0:
        raise ServeParseError(
            f"vLLM's parser exited with status {done.returncode}: {' '.join(stderr_tail) or 'no message'}"
        )
    try:
        out = json.loads(done.stdout)
    except ValueError:
        raise ServeParseError(f"vLLM's parser printed no JSON: {done.stdout[-300:]!r}") from None
    if not isinstance(out, dict):
        raise ServeParseError("vLLM's parser printed JSON that is not an object")
    if "error" in out:
        # argparse's own message ("error: unrecognized arguments: --swap-space=16") is on stderr.
        detail = next((line for line in reversed(done.stderr.splitlines()) if "error:" in line), "")
        raise ServeParseError(f"{out['error']}{': ' + detail.strip() if detail else ''}")
    return out


def parse_serve_command(argv: list[str], engine_python: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
    """Parse a ``vllm serve`` command line with the engine's own vLLM parser.

    ``argv`` is the command as a list (``["vllm", "serve", "/models/m", "--max-num-seqs", "64"]``,
    ``[python, "-m", "vllm.entrypoints.openai.api_server", "--model", ...]``, or only the
    arguments). Returns ``{"model": str | None, "args": {dest: value}, "vllm_version": str}`` with
    every arg that differs from the parser's default; raises :class:`ServeParseError`.
    """
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ServeParseError("the command must be a list of strings")
    args = serve_arguments(argv)
    if len(args) > MAX_ARGV_ITEMS or sum(len(a) for a in args) > MAX_ARGV_CHARS:
        raise ServeParseError(
            f"the command is longer than {MAX_ARGV_ITEMS} items or {MAX_ARGV_CHARS} characters"
        )
    if any("\x00" in a for a in args):
        raise ServeParseError("the command holds a NUL character")
    refused = next((a for a in args if re.match(r"^(--config|-h|--help)(=|$)", a)), None)
    if refused is not None:
        # The probe refuses them too; this says so without starting it.
        raise ServeParseError(
            f"{refused.split('=')[0]} is not read here: --config names a file vLLM would read on this "
            "machine (give the arguments it holds instead), and --help prints help"
        )
    out = run_probe(engine_python, ["parse", "--", *args], timeout_s=timeout_s)
    if not isinstance(out.get("args"), dict):
        raise ServeParseError("vLLM's parser printed no args")
    return {"model": out.get("model"), "args": out["args"], "vllm_version": str(out.get("vllm_version", ""))}


def dump_catalogue(engine_python: str, *, timeout_s: float = 300.0) -> dict[str, Any]:
    """The probe's ``dump`` (what vllm_flags/vllm-<version>.json holds) from an engine's interpreter."""
    return run_probe(engine_python, ["dump"], timeout_s=timeout_s)
