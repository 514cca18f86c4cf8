"""Where a deployment's text starts vLLM: the argv a ``vllm serve`` command line, a Kubernetes
workload or a Helm values file hands to vLLM's argument parser.

Pure: no Django, no vLLM. This module only finds the arguments; what they mean is vLLM's own
parser's to say (workers/engine/vllm_args.parse_serve_command, run in the engine's interpreter),
so nothing here knows a flag's name or arity. apps/experiments/baseline_capture.py builds B0
from what is found.

1. A command line: shell words (``shlex``, comments and backslash-newline continuations
   allowed), split at the shell's operators (``&&``, ``;``, ``|``), the segment that starts
   vLLM kept: ``vllm serve [MODEL] ARGS``, ``python -m vllm.entrypoints.openai.api_server ARGS``,
   or ``docker|podman run ... IMAGE ARGS`` with a vLLM image (whose entrypoint is ``vllm serve``).
2. A Kubernetes manifest (one or several YAML documents; a ``List`` too): the pod template of
   a Deployment, StatefulSet, DaemonSet, ReplicaSet or Job, or a Pod's own spec; the container
   whose ``command``/``args`` start vLLM, or whose image is a vLLM image and has no ``command``.
   ``$(VAR)`` in ``command``/``args`` is expanded from the container's ``env`` as the kubelet does;
   a ``sh -c`` script is read as a command line with ``$VAR``/``${VAR}`` expanded the same way.
3. Helm values: the values tree is searched for a container (a mapping with ``command``/``args``
   that start vLLM, or a vLLM ``image`` with ``args``/``extraArgs``) or a string holding a
   ``vllm serve`` command line. Chart-specific keys that hold single settings (not a command
   line) are not read: their names differ from chart to chart.

Exactly one place must start vLLM; none or several (unless ``container`` names one) is a
:class:`DeploymentTextError` naming what was found where.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

# The kinds whose pod template (spec.template.spec) holds the containers; a Pod holds them in spec.
POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})
# The modules that run vLLM's OpenAI server with its ``vllm serve`` parser (as
# workers/engine/vllm_args.serve_arguments reads them), and the CLI's module (then ``serve``).
API_SERVER_MODULES = frozenset(
    {"vllm.entrypoints.openai.api_server", "vllm.entrypoints.launchers.api_server.entry"}
)
CLI_MODULE = "vllm.entrypoints.cli.main"
# A vLLM image (vllm/vllm-openai, vllm/vllm-openai-cpu, a mirror's .../vllm-openai:tag): its
# entrypoint is ``vllm serve``, so a container of it with no ``command`` passes ``args`` to it.
_VLLM_IMAGE = re.compile(r"(^|/)vllm[-\w.]*(:[-\w.]+)?(@sha256:[0-9a-f]{64})?$", re.IGNORECASE)
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh"})
# `docker run` / `podman run` options written with their value as the next word.
_RUN_OPTIONS_WITH_VALUE = frozenset(
    {
        "-v",
        "--volume",
        "-p",
        "--publish",
        "-e",
        "--env",
        "--env-file",
        "--name",
        "--gpus",
        "--mount",
        "--network",
        "--net",
        "--ipc",
        "--shm-size",
        "-w",
        "--workdir",
        "--entrypoint",
        "--runtime",
        "-u",
        "--user",
        "--device",
        "--cpus",
        "-m",
        "--memory",
        "--label",
        "-l",
        "--platform",
        "--ulimit",
        "--cap-add",
        "--security-opt",
        "--hostname",
        "-h",
        "--restart",
        "--pull",
    }
)
_OPERATORS = frozenset({"&&", "||", ";", "|", "&", ";;", "(", ")", "<", ">", ">>"})
_K8S_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_SHELL_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
MAX_TEXT_BYTES = 1_000_000


class DeploymentTextError(ValueError):
    """Text that names no single vLLM start; the message says what was found and where."""


@dataclass(frozen=True)
class VllmStart:
    """What starts vLLM: the arguments after ``vllm serve`` (a model may lead them, positionally)
    or after the API server module, and where they were found."""

    argv: tuple[str, ...]
    where: str  # e.g. "Deployment/default/llm container vllm", "command line", "values.server"
    image: str = ""  # the container's image, where a manifest or values name one


def _is_vllm_image(image: Any) -> bool:
    return isinstance(image, str) and bool(_VLLM_IMAGE.search(image.strip()))


def _image_text(image: Any) -> str:
    """A Helm chart writes an image as a string or as {repository, tag}."""
    if isinstance(image, Mapping):
        repo, tag = str(image.get("repository") or ""), str(image.get("tag") or "")
        return f"{repo}:{tag}" if repo and tag else repo
    return image if isinstance(image, str) else ""


def _words(text: str) -> list[str]:
    """Shell words of a command line, the shell's operators as words of their own."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError as exc:  # an unclosed quote
        raise DeploymentTextError(f"the command line cannot be split into words: {exc}") from None


def _segments(words: Sequence[str]) -> Iterator[list[str]]:
    current: list[str] = []
    for word in words:
        if word in _OPERATORS:
            if current:
                yield current
            current = []
        else:
            current.append(word)
    if current:
        yield current


def _start_in(words: Sequence[str]) -> tuple[str, ...] | None:
    """The argv after the program in one shell segment that starts vLLM, else None."""
    for i, word in enumerate(words):
        base = word.rsplit("/", 1)[-1]
        if base == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return tuple(words[i + 2 :])
        if word == "-m" and i + 1 < len(words) and words[i + 1] in API_SERVER_MODULES:
            return tuple(words[i + 2 :])
        if word == "-m" and list(words[i + 1 : i + 3]) == [CLI_MODULE, "serve"]:
            return tuple(words[i + 3 :])
        if base in ("docker", "podman") and i + 1 < len(words) and words[i + 1] == "run":
            for j in range(i + 2, len(words)):
                if words[j - 1] in _RUN_OPTIONS_WITH_VALUE:
                    continue  # the value of -v, -p, -e, ...: a volume path is no image
                if not words[j].startswith("-") and _is_vllm_image(words[j]):
                    rest = tuple(words[j + 1 :])
                    # An image run with a command of its own: look for the start inside it.
                    inner = _start_in(rest) if rest and not rest[0].startswith("-") else None
                    return inner if inner is not None else rest
            return None
    return None


def starts_in_command_line(text: str) -> list[tuple[str, ...]]:
    """Every argv a command line hands to vLLM (one per shell segment that starts it)."""
    return [argv for seg in _segments(_words(text)) if (argv := _start_in(seg)) is not None]


def from_command_line(text: str) -> VllmStart:
    """The one vLLM start of a command line (step 1 of the module docstring)."""
    if len(text.encode("utf-8", "replace")) > MAX_TEXT_BYTES:
        raise DeploymentTextError(f"the text is over {MAX_TEXT_BYTES} bytes")
    starts = starts_in_command_line(text)
    if not starts:
        raise DeploymentTextError(
            "no vLLM start found: expected `vllm serve [MODEL] ...`, "
            "`python -m vllm.entrypoints.openai.api_server ...` or `docker run ... <vllm image> ...`"
        )
    if len(starts) > 1:
        raise DeploymentTextError(f"the command line starts vLLM {len(starts)} times; give one of them")
    return VllmStart(argv=starts[0], where="command line")


# --- containers (Kubernetes and Helm) ----------------------------------------------------------


def _env(container: Mapping[str, Any], where: str) -> dict[str, str | None]:
    """The container's literal env values; None for one taken from elsewhere (valueFrom)."""
    out: dict[str, str | None] = {}
    env = container.get("env") or []
    if isinstance(env, Mapping):  # Helm charts often write env as a mapping
        return {str(k): (None if isinstance(v, Mapping) else str(v)) for k, v in env.items()}
    if not isinstance(env, list):
        raise DeploymentTextError(f"{where}: env must be a list")
    for item in env:
        if isinstance(item, Mapping) and item.get("name"):
            value = item.get("value")
            out[str(item["name"])] = None if value is None and "valueFrom" in item else str(value or "")
    return out


def _expand(word: str, env: Mapping[str, str | None], where: str, pattern: re.Pattern[str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = next(g for g in m.groups() if g)
        if name not in env:
            if pattern is _K8S_VAR:  # the kubelet leaves an unknown $(VAR) as written
                return m.group(0)
            raise DeploymentTextError(f"{where}: ${name} is not set in the container's env")
        value = env[name]
        if value is None:
            raise DeploymentTextError(
                f"{where}: {name} comes from a secret, config map or field (valueFrom), which is not read; "
                "give its value in the text"
            )
        return value

    return pattern.sub(sub, word)


def _string_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(x, str | int | float) for x in value):
        raise DeploymentTextError(f"{where} must be a list of strings")
    return [str(x) for x in value]


def container_start(container: Mapping[str, Any], where: str) -> VllmStart | None:
    """The vLLM start of one container (its command and args, its env expanded), or None."""
    env = _env(container, where)
    command = [
        _expand(w, env, where, _K8S_VAR) for w in _string_list(container.get("command"), f"{where}.command")
    ]
    args = [_expand(w, env, where, _K8S_VAR) for w in _string_list(container.get("args"), f"{where}.args")]
    args += [
        _expand(w, env, where, _K8S_VAR)
        for w in _string_list(container.get("extraArgs"), f"{where}.extraArgs")
    ]
    image = _image_text(container.get("image"))
    words = command + args
    if not command and _is_vllm_image(image):
        return VllmStart(argv=tuple(args), where=where, image=image)
    if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in _SHELLS and words[1] in ("-c", "-lc", "-ec"):
        script = _expand(words[2], env, where, _SHELL_VAR)
        starts = starts_in_command_line(script)
        if len(starts) > 1:
            raise DeploymentTextError(f"{where}: the script starts vLLM {len(starts)} times")
        return VllmStart(argv=starts[0], where=where, image=image) if starts else None
    argv = _start_in(words)
    return None if argv is None else VllmStart(argv=argv, where=where, image=image)


def _pick(starts: list[VllmStart], container: str | None, what: str) -> VllmStart:
    if container:
        chosen = [s for s in starts if s.where.endswith(f"container {container}") or s.where == container]
        if not chosen:
            found = ", ".join(s.where for s in starts) or "none"
            raise DeploymentTextError(f"no vLLM container named {container!r} in {what} (found: {found})")
        starts = chosen
    if not starts:
        raise DeploymentTextError(
            f"no container in {what} starts vLLM (a `vllm serve` command or args, or a vLLM image without a command)"
        )
    if len(starts) > 1:
        raise DeploymentTextError(
            f"{len(starts)} containers in {what} start vLLM ({', '.join(s.where for s in starts)}): "
            "name the one that is B0"
        )
    return starts[0]


def _documents(text: str, what: str) -> list[Any]:
    if len(text.encode("utf-8", "replace")) > MAX_TEXT_BYTES:
        raise DeploymentTextError(f"the text is over {MAX_TEXT_BYTES} bytes")
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        raise DeploymentTextError(
            f"{line}the {what} is not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise DeploymentTextError(f"the {what} cannot be read: {str(exc)[:200]}") from None
    return docs


def _mapping_at(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def _pod_containers(doc: Mapping[str, Any]) -> tuple[str, list[Any]] | None:
    """(the object's name, its containers) for a workload kind or a Pod, else None."""
    kind = doc.get("kind")
    meta = _mapping_at(doc, "metadata")
    name = "/".join(str(p) for p in (kind, meta.get("namespace"), meta.get("name")) if p)
    spec = _mapping_at(doc, "spec")
    if kind == "Pod":
        pod = spec
    elif kind in POD_TEMPLATE_KINDS:
        pod = _mapping_at(_mapping_at(spec, "template"), "spec")
    else:
        return None
    containers = pod.get("containers")
    return name, containers if isinstance(containers, list) else []


def from_kubernetes(text: str, *, container: str | None = None) -> VllmStart:
    """The vLLM start of a Kubernetes manifest (step 2 of the module docstring)."""
    docs = _documents(text, "manifest")
    items: list[Any] = []
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            items.extend(doc["items"])
        else:
            items.append(doc)
    workloads = [found for doc in items if isinstance(doc, Mapping) and (found := _pod_containers(doc))]
    if not workloads:
        kinds = sorted({str(d.get("kind")) for d in items if isinstance(d, Mapping)}) or ["none"]
        raise DeploymentTextError(
            "no Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or Pod in the manifest "
            f"(kinds found: {', '.join(kinds)})"
        )
    starts = []
    for name, containers in workloads:
        for i, c in enumerate(containers):
            if not isinstance(c, Mapping):
                continue
            start = container_start(c, f"{name} container {c.get('name') or i}")
            if start is not None:
                starts.append(start)
    return _pick(starts, container, "the manifest")


def _walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def from_helm_values(text: str, *, container: str | None = None) -> VllmStart:
    """The vLLM start of a Helm values file (step 3 of the module docstring)."""
    docs = _documents(text, "values file")
    if len(docs) != 1 or not isinstance(docs[0], Mapping):
        raise DeploymentTextError("a values file is one YAML mapping")
    starts: list[VllmStart] = []
    inside: list[str] = []  # paths already read as a container, so their strings are not read twice
    for path, node in _walk(docs[0], "values"):
        if any(path.startswith(p + ".") or path.startswith(p + "[") for p in inside):
            continue
        if isinstance(node, Mapping) and ({"command", "args", "extraArgs"} & set(node) or "image" in node):
            has_args = any(node.get(k) for k in ("command", "args", "extraArgs"))
            if not has_args:
                continue
            where = f"{path} container {node['name']}" if isinstance(node.get("name"), str) else path
            start = container_start(node, where)
            if start is not None:
                starts.append(start)
                inside.append(path)
        elif isinstance(node, str) and "vllm" in node:
            try:
                found = starts_in_command_line(node)
            except DeploymentTextError:  # prose, not a command line (a quote left open)
                continue
            if len(found) > 1:
                raise DeploymentTextError(f"{path}: the text starts vLLM {len(found)} times")
            if found:
                starts.append(VllmStart(argv=found[0], where=path))
    return _pick(starts, container, "the values")
