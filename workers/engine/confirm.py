"""Confirm what a started vLLM server actually runs with, and who it is.

Pure functions over log text, JSON and label dicts (the server module does the
I/O). Three independent witnesses are compared with what was requested:

1. vLLM's startup log line ``non-default args: {...}`` (vLLM 0.32 logs the
   Python repr of a dict of every CLI arg that differs from its parser default;
   a requested value equal to that default is therefore absent, and accepted
   only if it equals the parser's default in the flag catalogue,
   workers/engine/vllm_args.py). Every requested arg is held to it, the flags
   that pass through to the server as much as the scheduler's; a flag that takes
   JSON is confirmed when each key requested has the value requested;
2. ``/v1/models``: the served name and ``max_model_len``;
3. the ``vllm:cache_config_info`` metric's labels: the KV cache size and
   prefix caching as the engine configured them, and a requested block size.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.engine.vllm_args import catalogue

NON_DEFAULT_MARKER = "non-default args: "
# Requested args the engine's cache_config_info metric must report as asked, and those it is held
# to where it reports them: the engine may override a block size it cannot use (vLLM's CPU
# backend does for some attention kernels), which the startup line, logged before, cannot show.
# (kv_cache_dtype is not among them: the metric reports "auto" resolved to the model's dtype.)
CACHE_LABELS = ("kv_cache_memory_bytes", "enable_prefix_caching")
CACHE_LABELS_WHERE_REPORTED = ("block_size",)


# The parser's defaults of the flags whose default is a value (not None): an arg left out runs
# with these (the pinned version's catalogue, read from vLLM's own parser).
VLLM_DEFAULTS: dict[str, Any] = {k: v for k, v in catalogue().defaults().items() if v is not None}


def _split_top_level(body: str) -> list[str]:
    """Split a dict body on commas that are not inside brackets or quotes."""
    items, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
        i += 1
    items.append(body[start:])
    return [item.strip() for item in items if item.strip()]


def parse_dict_repr(text: str) -> dict[str, Any]:
    """Parse a logged Python dict repr; values that are not literals are kept as their repr text."""
    text = text.strip()
    try:
        value = ast.literal_eval(text)
        if isinstance(value, dict):
            return value
    except (ValueError, SyntaxError):
        pass
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not a dict: {text[:80]!r}")
    out: dict[str, Any] = {}
    for item in _split_top_level(text[1:-1]):
        key_text, sep, value_text = item.partition(": ")
        if not sep:
            raise ValueError(f"not a key: value item: {item[:80]!r}")
        key = ast.literal_eval(key_text)
        try:
            out[key] = ast.literal_eval(value_text)
        except (ValueError, SyntaxError):
            out[key] = value_text
    return out


def parse_non_default_args(log_text: str) -> dict[str, Any] | None:
    """The dict from the last ``non-default args:`` line in a vLLM log, or None if there is none yet."""
    found = None
    for line in log_text.splitlines():
        at = line.find(NON_DEFAULT_MARKER)
        if at >= 0:
            found = line[at + len(NON_DEFAULT_MARKER) :]
    return None if found is None else parse_dict_repr(found)


# An enum in a logged repr (``<CUDAGraphMode.FULL: 2>``): its value.
_ENUM_REPR = re.compile(r"<[A-Za-z_][\w.]*: ('(?:[^'\\]|\\.)*'|-?[\d.]+)>")


def repr_value(text: str) -> Any:
    """A logged config object's repr as data: ``Name(a=1, b=Sub(c='x'))`` -> {"a": 1, "b": {"c": "x"}}.

    Literals stay literals; what is neither (a function, a path object) stays its source text;
    text that is no Python expression at all comes back unchanged.
    """
    try:
        tree = ast.parse(_ENUM_REPR.sub(r"\1", text.strip()), mode="eval")
    except SyntaxError:
        return text

    def value(node: ast.expr) -> Any:
        if isinstance(node, ast.Call) and node.keywords and not node.args:
            return {kw.arg: value(kw.value) for kw in node.keywords if kw.arg}
        if isinstance(node, ast.Dict):
            return {
                (value(k) if k is not None else None): value(v)
                for k, v in zip(node.keys, node.values, strict=True)
            }
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return [value(e) for e in node.elts]
        try:
            return ast.literal_eval(node)
        except ValueError:
            return ast.unparse(node)

    return value(tree.body)


def _contains(requested: Any, effective: Any) -> bool:
    """Whether each key of a requested JSON value has its requested value in the effective one."""
    if isinstance(effective, str) and isinstance(requested, dict | list):
        effective = repr_value(effective)
    if isinstance(requested, dict):
        return isinstance(effective, dict) and all(
            k in effective and _contains(v, effective[k]) for k, v in requested.items()
        )
    if isinstance(requested, list) and isinstance(effective, list | tuple):
        return len(requested) == len(effective) and all(map(_contains, requested, effective))
    return _same(requested, effective)


def _same(requested: Any, effective: Any) -> bool:
    if isinstance(requested, dict | list) and not isinstance(requested, bool):
        return _contains(requested, effective)
    if isinstance(requested, bool) or isinstance(effective, bool):
        return type(requested) is type(effective) and requested == effective
    if isinstance(requested, int | float) and isinstance(effective, int | float):
        return float(requested) == float(effective)
    return requested == effective


def _label_value(value: Any) -> str:
    # Prometheus labels are str(value) of the Python config attribute.
    return str(value)


@dataclass
class Confirmation:
    """The outcome of confirming a server's effective args against the request.

    ``effective_args``: every requested key with the value the server runs with,
    plus ``max_model_len``/``served_model_name`` from /v1/models and the KV cache
    facts from cache_config_info. ``mismatches``: key -> {requested, effective,
    source} for each disagreement; empty means confirmed.
    """

    effective_args: dict[str, Any] = field(default_factory=dict)
    mismatches: dict[str, dict[str, Any]] = field(default_factory=dict)
    non_default_args: dict[str, Any] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def reason(self) -> str:
        if self.ok:
            return ""
        parts = [
            f"{key} (requested {m['requested']!r}, {m['source']} says {m['effective']!r})"
            for key, m in sorted(self.mismatches.items())
        ]
        return "effective args differ from the request: " + "; ".join(parts)

    def record(self) -> dict[str, Any]:
        """JSON-ready value for Run.effective_args."""
        return {
            **self.effective_args,
            "vllm_non_default_args": _jsonable(self.non_default_args),
            "cache_config_info": dict(self.cache_config),
        }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def compare_effective(
    *,
    requested: Mapping[str, Any],
    model: str,
    served_model_name: str,
    non_default_args: Mapping[str, Any] | None,
    models_payload: Mapping[str, Any] | None,
    cache_config: Mapping[str, str] | None,
) -> Confirmation:
    """Compare the request with the three witnesses (steps in the module docstring)."""
    conf = Confirmation(non_default_args=dict(non_default_args or {}), cache_config=dict(cache_config or {}))

    def mismatch(key: str, want: Any, got: Any, source: str) -> None:
        conf.mismatches[key] = {"requested": want, "effective": got, "source": source}

    # 1. The startup log.
    if non_default_args is None:
        mismatch("non_default_args", "logged", None, "vLLM log (no 'non-default args' line)")
    else:
        logged_model = non_default_args.get("model", non_default_args.get("model_tag"))
        if logged_model is not None and logged_model != model:
            mismatch("model", model, logged_model, "non-default args")
        for key, want in requested.items():
            if key in non_default_args:
                got = non_default_args[key]
                if key == "served_model_name" and isinstance(got, list | tuple) and len(got) == 1:
                    got = got[0]
                conf.effective_args[key] = got
                if not _same(want, got):
                    mismatch(key, want, got, "non-default args")
            elif key in VLLM_DEFAULTS and _same(want, VLLM_DEFAULTS[key]):
                conf.effective_args[key] = VLLM_DEFAULTS[key]
            else:
                conf.effective_args[key] = None
                mismatch(key, want, None, "non-default args (absent)")

    # 2. /v1/models.
    entries = list((models_payload or {}).get("data") or [])
    served = next((m for m in entries if m.get("id") == served_model_name), None)
    if served is None:
        mismatch("served_model_name", served_model_name, [m.get("id") for m in entries], "/v1/models")
    else:
        conf.effective_args["served_model_name"] = served.get("id")
        conf.effective_args["max_model_len"] = served.get("max_model_len")
        want_len = requested.get("max_model_len")
        if want_len is not None and not _same(want_len, served.get("max_model_len")):
            mismatch("max_model_len", want_len, served.get("max_model_len"), "/v1/models")

    # 3. cache_config_info.
    if cache_config is None:
        mismatch("cache_config_info", "present", None, "/metrics")
    else:
        for key in (*CACHE_LABELS, *(k for k in CACHE_LABELS_WHERE_REPORTED if k in cache_config)):
            if key in requested and cache_config.get(key) != _label_value(requested[key]):
                mismatch(key, requested[key], cache_config.get(key), "cache_config_info")
        # What the engine chose where nothing was requested: facts beside the args.
        for key in ("block_size", "num_gpu_blocks", "kv_cache_size_tokens", "cache_dtype"):
            if key in cache_config and key not in requested:
                conf.effective_args[key] = cache_config[key]
    return conf


def check_revisions(
    *, model_dir: Path | None, revision: str | None, tokenizer_revision: str | None
) -> dict[str, dict[str, Any]]:
    """Compare configured revisions with the model directory's revision file (if it has one).

    Returns mismatches keyed like compare_effective's. A hub model id (no local
    directory) or a directory without the file is trusted as configured.
    """
    from workers.engine.tinymodel import read_revisions

    if model_dir is None or not Path(model_dir).is_dir():
        return {}
    recorded = read_revisions(Path(model_dir))
    if recorded is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for key, want in (("revision", revision), ("tokenizer_revision", tokenizer_revision)):
        have = recorded.get("model_revision" if key == "revision" else key)
        if want is not None and have is not None and want != have:
            out[key] = {"requested": want, "effective": have, "source": f"{model_dir}/tailtune-revision.json"}
    return out


def local_install_digest(python: str) -> tuple[str, str] | None:
    """(version, "name==version sha256:<RECORD hash>") of the vLLM distribution beside an interpreter.

    Looks for a ``vllm*.dist-info`` with a RECORD in the interpreter's venv
    (``<venv>/lib/python3*/site-packages``); None when there is none.
    """
    root = Path(python).parent.parent
    for dist in sorted(root.glob("lib/python3*/site-packages/vllm*.dist-info")):
        record, metadata = dist / "RECORD", dist / "METADATA"
        if not (record.is_file() and metadata.is_file()):
            continue
        meta = dict(
            line.split(": ", 1)
            for line in metadata.read_text().splitlines()
            if line.startswith(("Name: ", "Version: "))
        )
        digest = hashlib.sha256(record.read_bytes()).hexdigest()
        version = meta.get("Version", "")
        return version, f"{meta.get('Name', dist.name)}=={version} sha256:{digest}"
    return None


@functools.cache
def local_hardware_id() -> str:
    """This host's hardware id (TAILTUNE_HARDWARE_ID overrides the detection), for pinning
    an experiment to one kind of hardware (apps/runs/scheduling.py)."""
    override = os.environ.get("TAILTUNE_HARDWARE_ID", "").strip()
    return override or hardware_id(devices=os.environ.get("TAILTUNE_DEVICES", ""))


def hardware_id(*, devices: str = "") -> str:
    """GPU names, count and driver from nvidia-smi; else the CPU model and core count."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
            rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
            wanted = {d.strip() for d in devices.split(",") if d.strip()}
            if wanted:
                rows = [r for r in rows if r[0] in wanted] or rows
            if rows:
                names = sorted({r[1] for r in rows})
                drivers = sorted({r[2] for r in rows})
                return f"{len(rows)}x {'/'.join(names)} (driver {'/'.join(drivers)})"
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu: {model} x{cores} cores"
