"""Ask vLLM's own ``vllm serve`` argument parser: run by the engine's interpreter, never imported.

    <engine python> workers/engine/vllm_parser_probe.py dump
    <engine python> workers/engine/vllm_parser_probe.py parse -- <the arguments after `vllm serve`>

``dump`` prints, as JSON, every action of the parser the installed vLLM builds for its OpenAI
server (the one ``vllm serve`` and ``python -m vllm.entrypoints.openai.api_server`` use): its
dest, option strings, action, type, choices, default, nargs and the first paragraph of its help.
tailtune commits that output per vLLM version (workers/engine/vllm_flags/) and checks specs
against it without importing vLLM (workers/engine/vllm_args.py).

``parse`` parses the arguments with that same parser and prints
``{"model": ..., "args": {dest: value}, "vllm_version": ...}`` with every arg whose value differs from the parser's
default (how vLLM's own "non-default args" log line is made), or ``{"error": ...}``.

Values that are not JSON are written as follows: a tuple or set as a list (a set sorted), an
enum as its value, anything else as its ``str``. A flag that takes JSON (a config dataclass or a
dict) is reported as the JSON it was given, not as the object vLLM builds from it (whose fields
are all of them). ``--config`` (vLLM would read that file here) and ``--help`` are refused.

This file runs in the engine's virtual environment: it imports nothing of tailtune's, only the
standard library and vLLM, and only inside the functions below.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import re
import sys
from typing import Any

# Types vLLM gives flags that take JSON (workers/engine/vllm_args.py reads the same names).
JSON_TYPES = frozenset({"loads", "parse_dataclass", "union_dict_and_str"})


def _parser() -> argparse.ArgumentParser:
    """The parser vLLM's OpenAI server parses its command line with."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM 0.3x
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.1x
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    parser: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser())
    return parser


def _inner_type(func: Any) -> tuple[str | None, bool]:
    """(the name of the function that converts the value, whether ``None``/"" is accepted).

    vLLM wraps its converters (``optional_type(int)``, ``parse_type(json.loads)``): the
    closure holds the wrapped one.
    """
    optional = False
    for _ in range(4):
        if func is None:
            return None, optional
        name = getattr(func, "__name__", type(func).__name__)
        if name not in ("_optional_type", "_parse_type"):
            return name, optional
        optional = optional or name == "_optional_type"
        cells = [c.cell_contents for c in (func.__closure__ or ())]
        func = next((c for c in cells if callable(c)), None)
    return None, optional


def jsonable(value: Any) -> Any:
    """A JSON value for ``value`` (the rules in the module docstring)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((jsonable(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    return str(value)


def _action_kind(action: argparse.Action) -> str:
    name = type(action).__name__
    return {
        "_StoreAction": "store",
        "_StoreTrueAction": "store_true",
        "_StoreFalseAction": "store_false",
        "BooleanOptionalAction": "boolean_optional",
        "_AppendAction": "append",
        "_HelpAction": "help",
    }.get(name, name)


def dump() -> dict[str, Any]:
    import vllm

    flags = []
    for action in _parser()._actions:
        type_name, optional = _inner_type(action.type)
        default = action.default
        help_text = action.help if isinstance(action.help, str) else ""
        flags.append(
            {
                "dest": action.dest,
                "options": list(action.option_strings),
                "action": _action_kind(action),
                "type": type_name,
                "optional": optional,
                "nargs": action.nargs,
                "choices": None if action.choices is None else [jsonable(c) for c in action.choices],
                # argparse.SUPPRESS: the dest is absent from the namespace unless given.
                "default": None if default == argparse.SUPPRESS else jsonable(default),
                "suppressed_default": default == argparse.SUPPRESS,
                # Its first paragraph, on one line (vLLM wraps its help text).
                "help": " ".join(help_text.strip().split("\n\n", 1)[0].split()),
            }
        )
    return {"vllm_version": vllm.__version__, "flags": flags}


class ProbeRefused(ValueError):
    pass


_REFUSED = re.compile(r"^(--config|-h|--help)(=|$)")


def parse(argv: list[str]) -> dict[str, Any]:
    for arg in argv:
        if _REFUSED.match(arg):
            raise ProbeRefused(
                f"{arg.split('=')[0]} is not read here: --config names a file vLLM would read on this "
                "machine, and --help prints help instead of parsing"
            )
    parser = _parser()
    given_json: dict[str, Any] = {}
    for action in parser._actions:
        type_name, _ = _inner_type(action.type)
        if type_name in JSON_TYPES:
            action.type = _recording(action.type, action.dest, given_json)
    defaults = vars(parser.parse_args([]))
    given_json.clear()
    try:
        namespace = vars(parser.parse_args(argv))
    except SystemExit as exc:  # argparse has printed its message to stderr
        raise ProbeRefused(
            f"vLLM's parser refused the arguments (exit {exc.code}); see its message"
        ) from None
    args: dict[str, Any] = {}
    for dest, value in namespace.items():
        if dest in defaults and defaults[dest] == value:
            continue
        args[dest] = given_json[dest] if dest in given_json else jsonable(value)
    model = args.pop("model_tag", None) or args.pop("model", None)
    args.pop("model", None)
    import vllm

    return {"model": model, "args": args, "vllm_version": vllm.__version__}


def _recording(convert: Any, dest: str, given: dict[str, Any]) -> Any:
    def record(text: str) -> Any:
        value = convert(text)
        try:
            given[dest] = json.loads(text)
        except ValueError:
            given[dest] = jsonable(value)
        return value

    return record


def main(argv: list[str]) -> int:
    if argv == ["dump"]:
        # vLLM fills in each flag's help (its config's attribute docs) only when "--help" is on
        # the command line it was started with (vllm.engine.arg_utils.NEEDS_HELP).
        sys.argv = [sys.argv[0], "--help"]
        command = dump
    elif argv[:1] == ["parse"]:
        rest = argv[2:] if argv[1:2] == ["--"] else argv[1:]

        def command() -> dict[str, Any]:
            try:
                return parse(rest)
            except ProbeRefused as exc:
                return {"error": str(exc)}

    else:
        print("usage: vllm_parser_probe.py dump | parse -- <vllm serve arguments>", file=sys.stderr)
        return 2
    # vLLM logs to standard output; only the JSON goes there.
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = command()
    out.write(json.dumps(result, indent=1 if argv == ["dump"] else None, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
