"""Capture B0: production's config as a spec fragment (model, controls, baseline with its args
and the ``capture`` record), from what production really runs.

Pure: no Django (the operator's server names and the approved manifests are looked up by
apps/approvals/capture_sources.py, which calls this). docs/SPEC.md, "Capturing B0".

1. The sources, each read as bytes whose sha256 the record keeps:
   - a running server (:func:`fetch_server`, :func:`from_server`): ``/v1/models`` (the model
     and its max length), ``/metrics`` (``vllm:cache_config_info``: the KV cache's settings, the
     only ``*_info`` gauge vLLM 0.32 publishes about its config) and ``/version``;
   - a deployment's text (:func:`from_text`): a ``vllm serve`` command line, a Kubernetes
     manifest or Helm values (apps/experiments/deployment_text.py finds the arguments), parsed by
     vLLM's own parser in the engine's interpreter (workers/engine/vllm_args.parse_serve_command);
   - an approved rollback manifest (:func:`from_manifest`): the approved cell's args as the
     engine confirmed them, and the manifest's controls.
2. What was read is split (:func:`split_args`): the frozen controls to ``controls``, the model
   and its revisions to ``model``, what only concerns where that server listened (its port, its
   served name, its API key: never stored) dropped with a note, a flag the deny-list refuses is an
   error naming it, and the rest are B0's ``args``, each checked like a spec's.
3. :func:`fragment` is the spec fragment to merge; :func:`apply_to_spec` replaces a spec's B0 with it.

Over 500 lines on purpose: the three sources end in one split and one record, and a reader
checking what a capture keeps or drops needs the sources and the split side by side.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from apps.experiments.deployment_text import (
    DeploymentTextError,
    VllmStart,
    from_command_line,
    from_helm_values,
    from_kubernetes,
)
from apps.experiments.spec_capture import CAPTURE_SOURCES
from apps.experiments.spec_checker import FieldError, SpecError
from apps.experiments.spec_types import BaselineCapture
from workers.engine.confirm import local_install_digest
from workers.engine.scrape import parse_metrics

# The flags that are tailtune's frozen controls (the spec's ``controls``), not B0's args.
CONTROL_ARGS = (
    "dtype",
    "tensor_parallel_size",
    "max_model_len",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "enable_prefix_caching",
    "seed",
)
# The flags that name the model's revisions (the spec's ``model``).
MODEL_ARGS = ("revision", "tokenizer_revision")
# Where one server listens and who may call it: not part of the config B0 is. The sweep's own
# servers get their own (workers/engine/launcher.py); a rollback keeps the deployment's.
SERVING_LOCAL = frozenset(
    {
        "host",
        "port",
        "uds",
        "served_model_name",
        "uvicorn_log_level",
        "disable_uvicorn_access_log",
        "root_path",
        "allowed_origins",
        "allow_credentials",
        "allowed_methods",
        "allowed_headers",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_ca_certs",
        "ssl_cert_reqs",
        "enable_ssl_refresh",
        "disable_fastapi_docs",
        "enable_log_requests",
        "disable_log_requests",
        "max_log_len",
        "device",
        "devices",
        # Where that server sends its traces: tailtune's launcher points its own servers at the
        # worker's span receiver (workers/engine/spans.py).
        "otlp_traces_endpoint",
    }
)
# Secrets: dropped, and the note never shows the value.
SECRETS = frozenset({"api_key"})
# vllm:cache_config_info's labels that are the value of a flag (vLLM 0.32's CacheConfig, read from
# vllm/config/cache.py and engine/arg_utils.py): label -> the flag's dest. The other labels are
# what the engine worked out (num_gpu_blocks, kv_cache_size_tokens, ...), not flags; block_size is
# read only when user_specified_block_size says it was given.
CACHE_LABEL_ARGS = {
    "block_size": "block_size",  # only when user_specified_block_size says it was given
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "cache_dtype": "kv_cache_dtype",
    "enable_prefix_caching": "enable_prefix_caching",
    "prefix_caching_hash_algo": "prefix_caching_hash_algo",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "kv_offloading_size": "kv_offloading_size",
    "kv_offloading_backend": "kv_offloading_backend",
    "kv_sharing_fast_prefill": "kv_sharing_fast_prefill",
}
# Not read although they are flags: the engine fills them in (a CPU server started without them
# shows mamba_ssm_cache_dtype="float32" against the flag's "auto", block_size="128" against none).
# The endpoints a server is read from, in the order their bodies enter the digest.
SERVER_PATHS = ("/v1/models", "/metrics", "/version")
MAX_BODY_BYTES = 8 << 20
SERVER_TIMEOUT_S = 10.0
SERVER_NOT_SEEN = (
    "a server shows only its KV cache's settings on /metrics (vllm:cache_config_info) and its model "
    "on /v1/models: the scheduler's flags (max_num_seqs, max_num_batched_tokens, chunked prefill, "
    "policy), dtype, parallelism and every other flag are not visible there, so B0 runs vLLM's "
    "defaults for them unless they are added (a command line, manifest or Helm values shows them all)"
)


class CaptureError(SpecError):
    """A source that cannot be captured; each error names the field of the request at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__([FieldError(field_name, message)])


class CaptureBusy(CaptureError):
    """vLLM's parser is already reading as many captures as the service allows at once: try again."""


@dataclass
class Captured:
    """B0 as captured: the spec's model, controls, engine image and B0's args, and the record."""

    model: dict[str, str]
    controls: dict[str, Any]
    args: dict[str, Any]
    capture: BaselineCapture
    image: str = ""
    notes: list[str] = field(default_factory=list)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def server_digest(bodies: Mapping[str, bytes]) -> str:
    """The digest of a server's answers as read: for each path of SERVER_PATHS in that order
    that answered, ``path``, a newline, the body's length in decimal, a newline, the body's
    bytes and a newline, all hashed as one stream (docs/SPEC.md, "Capturing B0")."""
    h = hashlib.sha256()
    for path in SERVER_PATHS:
        if path in bodies:
            body = bodies[path]
            h.update(f"{path}\n{len(body)}\n".encode("ascii") + body + b"\n")
    return h.hexdigest()


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def _record(
    source: str, name: str, sha: str, version: str, notes: list[str], at: str | None
) -> BaselineCapture:
    assert source in CAPTURE_SOURCES
    record: BaselineCapture = {
        "source": source,
        "name": name[:300],
        "captured_at": at or _now(),
        "sha256": sha,
    }
    if version:
        record["vllm_version"] = version[:64]
    if notes:
        record["notes"] = [n[:1000] for n in notes[:20]]
    return record


# --- 2. the split ---------------------------------------------------------------------------


def split_args(
    model: str | None,
    parsed: Mapping[str, Any],
    *,
    field_name: str,
    check_arg: Callable[[str, Any], str | None],
    denied: Mapping[str, str] | frozenset[str] | set[str],
) -> tuple[dict[str, str], dict[str, Any], dict[str, Any], list[str]]:
    """(model, controls, args, notes) from the flags a deployment gives (step 2 of the module
    docstring). Raises CaptureError naming every denied or unusable flag at once."""
    spec_model: dict[str, str] = {"path": str(model)} if model else {}
    controls: dict[str, Any] = {}
    args: dict[str, Any] = {}
    notes: list[str] = []
    errors: list[FieldError] = []
    for name, value in parsed.items():
        if name in SECRETS:
            notes.append(f"{name}: a secret, not captured")
        elif name in SERVING_LOCAL:
            notes.append(
                f"{name}: where that server listens or who may call it, not part of B0 ({value!r:.80})"
            )
        elif name in MODEL_ARGS:
            spec_model[name] = str(value)
        elif name in denied:
            why = denied[name] if isinstance(denied, Mapping) else "on the deny-list"
            errors.append(FieldError(field_name, f"captures {name}, which a spec cannot hold: {why}"))
        elif name in CONTROL_ARGS:
            controls[name] = value
        else:
            problem = check_arg(name, value)
            if problem is not None:
                errors.append(FieldError(field_name, f"captures {name}={value!r:.80}: {problem}"))
            else:
                args[name] = value
    if errors:
        raise SpecError(errors)
    return spec_model, controls, args, notes


def _engine() -> Any:
    from workers.engine import vllm_args

    return vllm_args


# --- 1. the sources -------------------------------------------------------------------------


def from_text(
    kind: str,
    text: str,
    *,
    engine_python: str,
    container: str | None = None,
    field_name: str = "text",
    name: str = "",
    at: str | None = None,
    parse: Callable[[list[str], str], dict[str, Any]] | None = None,
) -> Captured:
    """B0 from a command line (``command``), a Kubernetes manifest (``kubernetes``) or Helm
    values (``helm``), parsed by vLLM's own parser in ``engine_python`` (``parse``: the
    service's bounded, cached call of it, apps/approvals/capture_sources.py; default: direct)."""
    finders: dict[str, Callable[[str], VllmStart]] = {
        "command": from_command_line,
        "kubernetes": lambda t: from_kubernetes(t, container=container),
        "helm": lambda t: from_helm_values(t, container=container),
    }
    if kind not in finders:
        raise CaptureError("source", f"must be one of {', '.join(finders)} for a text, got {kind!r:.40}")
    if not isinstance(text, str) or not text.strip():
        raise CaptureError(field_name, "is empty: paste the command line, manifest or values")
    if "\x00" in text:
        raise CaptureError(field_name, "must be plain text (no NUL character)")
    try:
        start = finders[kind](text)
    except DeploymentTextError as exc:
        raise CaptureError(field_name, str(exc)) from None
    engine = _engine()
    try:
        parsed = (parse or engine.parse_serve_command)(list(start.argv), engine_python)
    except CaptureBusy as exc:
        raise CaptureBusy(field_name, exc.errors[0].message) from None
    except ValueError as exc:
        raise CaptureError(field_name, f"{start.where}: {exc}") from None
    model, controls, args, notes = split_args(
        parsed.get("model"),
        parsed.get("args") or {},
        field_name=field_name,
        check_arg=engine.check_arg,
        denied=engine.DENIED,
    )
    if "enable_prefix_caching" not in controls:
        # vLLM decides by the model (on for the models that support it); the spec says it outright.
        controls["enable_prefix_caching"] = True
        notes.append(
            "enable_prefix_caching: not given, so vLLM turns it on for a model that supports it; "
            "captured as true (set false if the model does not support it)"
        )
    if "max_model_len" not in controls:
        notes.append(
            "max_model_len: not given, so the model's own context length; set controls.max_model_len"
        )
    installed = local_install_digest(engine_python)  # the version whose parser read the text
    version = str(parsed.get("vllm_version") or (installed[0] if installed else ""))
    record = _record(
        kind,
        name or start.where,
        sha256_of(text.encode("utf-8")),
        version,
        notes,
        at,
    )
    return Captured(model=model, controls=controls, args=args, capture=record, image=start.image, notes=notes)


def fetch_server(
    base_url: str, *, timeout_s: float = SERVER_TIMEOUT_S, transport: Any = None
) -> dict[str, bytes]:
    """The bodies of SERVER_PATHS as read (``/version`` may be missing). No redirect is followed
    and no body is read past MAX_BODY_BYTES. CaptureError naming ``server`` when it does not answer."""
    bodies: dict[str, bytes] = {}
    with httpx.Client(timeout=timeout_s, follow_redirects=False, transport=transport) as client:
        for path in SERVER_PATHS:
            try:
                with client.stream("GET", base_url.rstrip("/") + path) as response:
                    chunks, size = [], 0
                    for chunk in response.iter_bytes():
                        size += len(chunk)
                        if size > MAX_BODY_BYTES:
                            raise CaptureError("server", f"{path} answered more than {MAX_BODY_BYTES} bytes")
                        chunks.append(chunk)
                    status = response.status_code
            except httpx.HTTPError as exc:
                raise CaptureError(
                    "server", f"did not answer {path}: {type(exc).__name__}: {str(exc)[:200]}"
                ) from None
            if status != 200:
                if path == "/version":
                    continue
                raise CaptureError("server", f"{path} answered HTTP {status}, not 200: is it a vLLM server?")
            bodies[path] = b"".join(chunks)
    return bodies


def _label_value(text: str) -> Any:
    """A label's value as the flag's value: labels are ``str()`` of the config's attribute."""
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def from_server(
    bodies: Mapping[str, bytes], *, name: str, defaults: Mapping[str, Any], at: str | None = None
) -> Captured:
    """B0 from a server's answers (``fetch_server``). ``defaults`` are vLLM's defaults of the
    flags in CACHE_LABEL_ARGS (from the catalogue of the server's version): a label equal to
    its flag's default is not a flag that was given."""
    try:
        models = json.loads(bodies["/v1/models"])
        entries = [m for m in models.get("data") or [] if isinstance(m, Mapping) and not m.get("parent")]
    except (ValueError, AttributeError, KeyError):
        raise CaptureError("server", "/v1/models is not the model list a vLLM server answers") from None
    if len(entries) != 1:
        raise CaptureError("server", f"/v1/models lists {len(entries)} base models; B0 serves one")
    served = entries[0]
    try:
        text = bodies["/metrics"].decode("utf-8")
        info = [s for s in parse_metrics(text, names=["vllm:cache_config_info"]) if s["kind"] == "info"]
    except (KeyError, UnicodeDecodeError, ValueError) as exc:
        raise CaptureError("server", f"/metrics cannot be read: {str(exc)[:200]}") from None
    if not info:
        raise CaptureError(
            "server", "/metrics has no vllm:cache_config_info: is it a vLLM server with its stats on?"
        )
    labels = dict(min(info, key=lambda s: str(s["labels"].get("engine", "")))["labels"])
    controls: dict[str, Any] = {"max_model_len": served.get("max_model_len")}
    args: dict[str, Any] = {}
    for label, dest in CACHE_LABEL_ARGS.items():
        if label not in labels:
            continue
        value = _label_value(labels[label])
        if label == "block_size" and labels.get("user_specified_block_size") != "True":
            continue  # the engine chose it
        if dest == "enable_prefix_caching":
            controls[dest] = bool(value)  # what it resolved to: the spec says it outright
            continue
        if value is None or (dest in defaults and value == defaults[dest]):
            continue
        (controls if dest in CONTROL_ARGS else args)[dest] = value
    version = ""
    if "/version" in bodies:
        try:
            version = str(json.loads(bodies["/version"]).get("version") or "")
        except (ValueError, AttributeError):
            version = ""
    notes = [SERVER_NOT_SEEN]
    record = _record("server", name, server_digest(bodies), version, notes, at)
    model = {"path": str(served.get("root") or served.get("id") or "")}
    return Captured(model=model, controls=controls, args=args, capture=record, notes=notes)


# Keys of a confirmed cell's effective args that are facts the engine worked out or reported,
# not flags (workers/engine/confirm.Confirmation.record).
_CONFIRMED_FACTS = frozenset(
    {"vllm_non_default_args", "cache_config_info", "num_gpu_blocks", "kv_cache_size_tokens", "cache_dtype"}
)


def from_manifest(doc: Mapping[str, Any], raw: bytes, *, name: str, at: str | None = None) -> Captured:
    """B0 from an approved rollback manifest: the approved cell (the overlay's, else the
    baseline's) as the engine confirmed it, with the manifest's controls, model and image."""
    base = doc.get("baseline") or {}
    overlay = doc.get("overlay") or {}
    effective = (overlay.get("effective_args") if overlay else None) or base.get("effective_args") or {}
    ran = dict(effective.get("args") or {})
    logged = ran.get("vllm_non_default_args")
    if isinstance(logged, Mapping) and logged:
        # Every flag the engine reported it ran with that differs from vLLM's default.
        flags = {k: v for k, v in logged.items() if k not in ("model", "model_tag")}
    else:
        flags = {k: v for k, v in ran.items() if k not in _CONFIRMED_FACTS}
    controls = {k: v for k, v in (base.get("controls") or {}).items() if v is not None}
    model_ref = base.get("model") or {}
    model = {
        "path": str(model_ref.get("path") or ""),
        "revision": str(model_ref.get("revision") or ""),
        "tokenizer_revision": str(base.get("tokenizer_revision") or ""),
    }
    engine = overlay.get("engine") if overlay else None
    if isinstance(engine, Mapping) and engine.get("model_revision"):
        model["revision"] = str(engine["model_revision"])
    vllm_args = _engine()
    notes: list[str] = []
    errors: list[FieldError] = []
    args: dict[str, Any] = {}
    for key, value in flags.items():
        if key in SECRETS or key in SERVING_LOCAL or key in MODEL_ARGS or key in CONTROL_ARGS:
            continue  # the manifest's own controls and model hold these
        if key in vllm_args.DENIED:
            errors.append(
                FieldError("experiment", f"the manifest's cell ran with {key}, which a spec cannot hold")
            )
            continue
        problem = vllm_args.check_arg(key, value)
        if problem is not None:
            errors.append(
                FieldError("experiment", f"the manifest's cell ran with {key}={value!r:.80}: {problem}")
            )
        else:
            args[key] = value
    if errors:
        raise SpecError(errors)
    image = str(
        ((engine or {}).get("image") if isinstance(engine, Mapping) else "") or base.get("image") or ""
    )
    version = str(base.get("vllm_version") or "")
    record = _record("manifest", name, sha256_of(raw), version, notes, at)
    return Captured(model=model, controls=controls, args=args, capture=record, image=image, notes=notes)


# --- 3. the fragment ------------------------------------------------------------------------


def fragment(captured: Captured, *, baseline_id: str = "B0", note: str = "") -> dict[str, Any]:
    """The spec fragment to merge: model, controls, engine image (when known) and baseline."""
    out: dict[str, Any] = {"model": dict(captured.model), "controls": dict(captured.controls)}
    if captured.image:
        out["engine"] = {"image": captured.image}
    out["baseline"] = {
        "id": baseline_id,
        "captured_from": note or f"{captured.capture['source']}: {captured.capture['name']}"[:500],
        "args": dict(captured.args),
        "capture": dict(captured.capture),
    }
    return out


def apply_to_spec(
    spec: Mapping[str, Any], captured: Captured, *, note: str = ""
) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``spec`` with B0 replaced by the capture: its baseline (keeping its id), the
    captured controls over its controls, the captured revisions and image. The spec's
    ``model.path`` is kept (the host's copy of the model; a deployment's path or hub id is not
    one): the notes say where the two differ."""
    out = json.loads(json.dumps(dict(spec), default=str))
    notes: list[str] = []
    old = out.get("baseline") if isinstance(out.get("baseline"), Mapping) else {}
    frag = fragment(captured, baseline_id=str(old.get("id") or "B0"), note=note)
    out["baseline"] = frag["baseline"]
    controls = out.get("controls") if isinstance(out.get("controls"), Mapping) else {}
    out["controls"] = {**controls, **frag["controls"]}
    model = out.get("model") if isinstance(out.get("model"), Mapping) else {}
    model = dict(model)
    for key in ("revision", "tokenizer_revision"):
        if captured.model.get(key):
            model[key] = captured.model[key]
    captured_path = captured.model.get("path")
    if not model.get("path"):
        model["path"] = captured_path or ""
    elif captured_path and captured_path != model["path"]:
        notes.append(
            f"model.path: kept {model['path']!r}; the deployment serves {captured_path!r} "
            "(check that they are the same model)"
        )
    out["model"] = model
    if captured.image:
        out["engine"] = {
            **(out.get("engine") if isinstance(out.get("engine"), Mapping) else {}),
            "image": captured.image,
        }
    return out, notes
