"""The flag catalogue against the installed CPU vLLM (#34 item 2).

1. The committed catalogue is what the installed engine's parser says, so a version bump cannot
   drift from what specs are checked against.
2. vLLM's own parser reads back every arg as tailtune writes it (arg_argv), through
   parse_serve_command, the function baseline capture uses.
A server started with flags that pass through, and their confirmation, share the one server
start of tests/engine/test_baseline_capture_engine.py. No server starts here: each test imports
vLLM once or twice in the engine's interpreter.
"""

from __future__ import annotations

import json

import pytest

from tests.engine_support import ENGINE_DIR, ENGINE_MARKS, MODEL
from workers.engine.vllm_args import (
    PINNED_VERSION,
    arg_argv,
    catalogue_path,
    dump_catalogue,
    parse_serve_command,
)

pytestmark = ENGINE_MARKS

ENGINE_PYTHON = str(ENGINE_DIR / "venv" / "bin" / "python")


def test_the_committed_catalogue_is_what_the_installed_parser_says() -> None:
    fresh = dump_catalogue(ENGINE_PYTHON)
    assert fresh["vllm_version"] == PINNED_VERSION
    committed = json.loads(catalogue_path(PINNED_VERSION).read_text())
    if fresh != committed:
        old = {f["dest"]: f for f in committed["flags"]}
        new = {f["dest"]: f for f in fresh["flags"]}
        changed = sorted(d for d in old.keys() | new.keys() if old.get(d) != new.get(d))
        pytest.fail(f"regenerate workers/engine/vllm_flags (docs/ENGINE.md); flags that differ: {changed}")


def test_vllms_parser_reads_back_every_arg_as_tailtune_writes_it() -> None:
    args = {
        "max_num_seqs": 8,
        "enable_chunked_prefill": False,
        "kv_cache_dtype": "fp8",
        "block_size": 16,
        "enforce_eager": True,
        "cpu_offload_gb": 2.5,
        "cudagraph_capture_sizes": [1, 2, 4],
        "hf_overrides": {"rope_theta": 10000},
        "quantization": "fp8",
        "aggregate_engine_logging": True,
    }
    argv = ["vllm", "serve", str(MODEL)] + [item for k, v in args.items() for item in arg_argv(k, v)]
    parsed = parse_serve_command(argv, ENGINE_PYTHON)
    assert parsed["model"] == str(MODEL)
    assert parsed["vllm_version"] == PINNED_VERSION
    assert parsed["args"] == args
    # vLLM 0.32 has no --swap-space: its parser's own words say so (through baseline capture:
    # tests/engine/test_baseline_capture_engine.py).
