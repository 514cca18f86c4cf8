from __future__ import annotations

import shlex

import pytest

from workers.engine.confirm import compare_effective
from workers.engine.launcher import (
    CONTROL_FLAGS,
    OTEL_ENV,
    SCHEDULER_FLAGS,
    SPAN_FLUSH_MS,
    DisallowedFlag,
    HostConfig,
    InvalidArgValue,
    LaunchError,
    build_launch,
    cpu_engine_host,
    validate_args,
    validate_controls,
)
from workers.engine.vllm_args import DENIED

HOST = HostConfig(vllm_command=("python", "-m", "vllm.entrypoints.openai.api_server"))
CONTROLS = {
    "dtype": "bfloat16",
    "tensor_parallel_size": 1,
    "max_model_len": 8192,
    "kv_cache_memory_bytes": 67108864,
    "enable_prefix_caching": False,
    "speculative_decoding": False,
    "seed": 0,
    "generation": {"temperature": 0.0, "ignore_eos": True},
    "revision": "tiny-llama-local-v1",
    "tokenizer_revision": "tiny-llama-local-v1",
}
CELL = {
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 16,
    "enable_chunked_prefill": True,
    "scheduling_policy": "fcfs",
}


def launch(cell=CELL, controls=CONTROLS, host=HOST, **kw):
    return build_launch(
        model="/models/tiny", cell_args=cell, controls=controls, host=host, port=8123, base_env={}, **kw
    )


def test_it_builds_an_argument_list_with_every_requested_flag():
    plan = launch()
    assert plan.argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--model=/models/tiny" in plan.argv
    assert "--host=127.0.0.1" in plan.argv and "--port=8123" in plan.argv
    for expected in [
        "--max-num-batched-tokens=2048",
        "--max-num-seqs=16",
        "--enable-chunked-prefill",
        "--scheduling-policy=fcfs",
        "--max-model-len=8192",
        "--dtype=bfloat16",
        "--kv-cache-memory-bytes=67108864",
        "--no-enable-prefix-caching",
        "--seed=0",
        "--revision=tiny-llama-local-v1",
    ]:
        assert expected in plan.argv
    assert all(isinstance(item, str) for item in plan.argv)
    assert plan.base_url == "http://127.0.0.1:8123"
    assert plan.requested["max_num_seqs"] == 16 and "generation" not in plan.requested


def test_it_passes_the_model_positionally_to_vllm_serve():
    plan = launch(host=HostConfig(vllm_command=("vllm", "serve")))
    assert plan.argv[:3] == ["vllm", "serve", "/models/tiny"]


def test_it_writes_false_booleans_as_no_flags():
    plan = launch(cell={**CELL, "enable_chunked_prefill": False})
    assert "--no-enable-chunked-prefill" in plan.argv and "--enable-chunked-prefill" not in plan.argv


def test_it_refuses_a_denied_or_unknown_flag_naming_it():
    with pytest.raises(DisallowedFlag) as info:
        launch(cell={**CELL, "trust_remote_code": True})
    assert info.value.name == "trust_remote_code"
    assert str(info.value).startswith("trust_remote_code: is denied: it runs Python code")
    with pytest.raises(DisallowedFlag, match="swap_space: is not a flag of vLLM 0.32.0's server"):
        launch(cell={**CELL, "swap_space": 16})
    with pytest.raises(DisallowedFlag, match="port: is denied: it is set by tailtune's launcher"):
        launch(cell={**CELL, "port": 9000})


def test_it_passes_every_other_flag_through_after_its_own_in_a_fixed_order():
    extra = {
        "kv_cache_dtype": "fp8",
        "enforce_eager": False,
        "block_size": 16,
        "cudagraph_capture_sizes": [1, 2],
    }
    plan = launch(cell={**CELL, **extra})
    tail = plan.argv[-6:]
    assert tail == [
        "--block-size=16",
        "--cudagraph-capture-sizes",
        "1",
        "2",
        "--no-enforce-eager",
        "--kv-cache-dtype=fp8",
    ]
    assert plan.requested["kv_cache_dtype"] == "fp8" and plan.requested["block_size"] == 16
    # The same cell written in another order gives the same command.
    assert launch(cell=dict(reversed(list({**CELL, **extra}.items())))).argv == plan.argv
    with pytest.raises(InvalidArgValue) as info:
        launch(cell={**CELL, "kv_cache_dtype": "fp9"})
    assert info.value.name == "kv_cache_dtype"


def test_it_refuses_a_frozen_control_set_by_a_cell():
    with pytest.raises(DisallowedFlag, match="max_model_len: is a frozen control"):
        launch(cell={**CELL, "max_model_len": 4096})


def test_it_refuses_speculative_decoding_on():
    with pytest.raises(DisallowedFlag, match="speculative_decoding"):
        launch(controls={**CONTROLS, "speculative_decoding": True})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_num_seqs", "16"),
        ("max_num_seqs", 0),
        ("max_num_seqs", True),
        ("enable_chunked_prefill", "yes"),
        ("scheduling_policy", "lifo"),
        ("max_num_batched_tokens", 2048.5),
    ],
)
def test_it_refuses_bad_values(name, value):
    with pytest.raises(InvalidArgValue) as info:
        launch(cell={**CELL, name: value})
    assert info.value.name == name


@pytest.mark.parametrize(
    "value",
    ["main; rm -rf /", "$(touch /tmp/pwned)", "--enforce-eager", "a b", "x\n--trust-remote-code", "`id`", ""],
)
def test_it_cannot_be_used_to_inject_a_command_or_flag(value):
    with pytest.raises(InvalidArgValue):
        launch(controls={**CONTROLS, "revision": value})
    with pytest.raises(LaunchError):
        build_launch(model=value or "-", cell_args=CELL, controls=CONTROLS, host=HOST, port=1, base_env={})


def test_it_keeps_each_value_inside_its_own_argument():
    plan = launch(controls={**CONTROLS, "served_model_name": "tiny-llama:v1"})
    assert "--served-model-name=tiny-llama:v1" in plan.argv
    # Round-tripping through a shell-style split changes nothing: no item holds a space or quote.
    assert shlex.split(shlex.join(plan.argv)) == plan.argv
    assert not any(" " in item for item in plan.argv)


def test_it_sets_offline_env_and_devices_and_never_the_cpu_kv_override():
    host = HostConfig(vllm_command=("vllm", "serve"), devices="2,3", extra_env={"NCCL_DEBUG": "WARN"})
    plan = build_launch(
        model="/m",
        cell_args=CELL,
        controls=CONTROLS,
        host=host,
        port=1,
        base_env={"PATH": "/usr/bin", "VLLM_CPU_KVCACHE_SPACE": "40"},
    )
    assert plan.env["HF_HUB_OFFLINE"] == "1" and plan.env["VLLM_NO_USAGE_STATS"] == "1"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert plan.env["NCCL_DEBUG"] == "WARN" and plan.env["PATH"] == "/usr/bin"
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env
    with pytest.raises(LaunchError, match="VLLM_CPU_KVCACHE_SPACE"):
        HostConfig(vllm_command=("vllm", "serve"), extra_env={"VLLM_CPU_KVCACHE_SPACE": "4"})


SPANS = "http://127.0.0.1:43210/v1/traces"


def test_it_points_the_servers_tracing_at_the_workers_receiver_itself():
    plan = launch(otlp_traces_endpoint=SPANS)
    assert plan.argv.count(f"--otlp-traces-endpoint={SPANS}") == 1
    assert plan.otlp_traces_endpoint == SPANS
    # OTLP over HTTP with protobuf bodies (vLLM's default is gRPC), flushed often.
    assert plan.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert plan.env["OTEL_BSP_SCHEDULE_DELAY"] == str(SPAN_FLUSH_MS) and SPAN_FLUSH_MS <= 500
    assert plan.env["OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"] == "none"
    # The launcher's own flag is no requested arg: the confirmation never holds the server to it.
    assert "otlp_traces_endpoint" not in plan.requested
    untraced = launch()
    assert not any(a.startswith("--otlp") for a in untraced.argv) and untraced.otlp_traces_endpoint is None
    assert not any(k.startswith("OTEL_") for k in untraced.env)


@pytest.mark.parametrize(
    "endpoint",
    ["http://collector.internal:4318/v1/traces", "http://127.0.0.1:4318/v1/logs", "127.0.0.1:4317", ""],
)
def test_it_traces_to_the_loopback_receiver_only(endpoint):
    with pytest.raises(LaunchError) as info:
        launch(otlp_traces_endpoint=endpoint)
    assert info.value.name == "otlp_traces_endpoint"


def test_a_spec_can_never_set_the_tracing_endpoint():
    with pytest.raises(DisallowedFlag) as info:
        launch(cell={**CELL, "otlp_traces_endpoint": "http://10.0.0.1:4318/v1/traces"})
    assert info.value.name == "otlp_traces_endpoint"
    assert "is denied: it is set by tailtune's launcher" in str(info.value)
    assert "otlp_traces_endpoint" in DENIED
    assert any(
        e.startswith("otlp_traces_endpoint: is denied") for e in validate_args({"otlp_traces_endpoint": "x"})
    )


def test_no_inherited_exporter_setting_reaches_the_server():
    host = HostConfig(
        vllm_command=("vllm", "serve"),
        extra_env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://elsewhere:4318/v1/traces"},
    )
    env = {
        "PATH": "/usr/bin",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://elsewhere:4318",
        "OTEL_SDK_DISABLED": "true",
    }
    for endpoint in (None, SPANS):
        plan = build_launch(
            model="/m",
            cell_args=CELL,
            controls=CONTROLS,
            host=host,
            port=1,
            base_env=env,
            otlp_traces_endpoint=endpoint,
        )
        assert {k: v for k, v in plan.env.items() if k.startswith("OTEL_")} == (OTEL_ENV if endpoint else {})


def test_the_confirmation_does_not_hold_the_server_to_the_launchers_own_flag():
    plan = launch(otlp_traces_endpoint=SPANS)
    logged = {**plan.requested, "model": plan.model, "otlp_traces_endpoint": SPANS, "host": "127.0.0.1"}
    logged["served_model_name"] = [plan.served_model_name]
    conf = compare_effective(
        requested=plan.requested,
        model=plan.model,
        served_model_name=plan.served_model_name,
        non_default_args=logged,
        models_payload={"data": [{"id": plan.served_model_name, "max_model_len": 8192}]},
        cache_config={"kv_cache_memory_bytes": "67108864", "enable_prefix_caching": "False"},
    )
    assert conf.ok, conf.reason


def test_it_binds_the_configured_host_and_picks_a_free_port():
    plan = build_launch(
        model="/m",
        cell_args=CELL,
        controls=CONTROLS,
        host=HostConfig(vllm_command=("v",), bind_host="127.0.0.1"),
    )
    assert 0 < plan.port < 65536 and f"--port={plan.port}" in plan.argv


def test_it_validates_spec_args_with_messages_keyed_by_name():
    assert validate_args(CELL) == []
    errors = validate_args({"max_num_seqs": -1, "bogus_flag": 1, "dtype": "half", "block_size": "16"})
    assert any(e.startswith("max_num_seqs:") for e in errors)
    assert any(e.startswith("bogus_flag:") for e in errors)
    assert any(e.startswith("dtype:") and "frozen control" in e for e in errors)
    assert "block_size: must be an integer (got '16')" in errors
    assert validate_controls(CONTROLS) == []
    assert validate_controls({"max_model_len": "long"}) == ["max_model_len: must be an integer"]
    assert set(SCHEDULER_FLAGS).isdisjoint(CONTROL_FLAGS)


def test_it_runs_the_cpu_engine_as_a_python_module(tmp_path):
    host = cpu_engine_host(tmp_path)
    assert host.vllm_command == (
        str(tmp_path / "venv" / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
    )
    assert not host.model_positional


def test_a_rehearsal_splits_the_host_between_its_two_servers():
    from workers.rehearsal_run import split_host

    cpu = HostConfig(vllm_command=("python",))
    (a, _), (b, _), note = split_host(cpu, {}, cpus=[0, 1, 2, 3])
    assert (a.extra_env["VLLM_CPU_OMP_THREADS_BIND"], b.extra_env["VLLM_CPU_OMP_THREADS_BIND"]) == (
        "0,1",
        "2,3",
    )
    assert note == "cores 0,1 for the candidate, 2,3 for B0"
    (a, _), (b, _), note = split_host(cpu, {}, cpus=[0])
    assert a.extra_env == b.extra_env == {"VLLM_CPU_OMP_THREADS_BIND": "0"} and "shared" in note
    gpus = HostConfig(vllm_command=("vllm", "serve"), devices="0,1")
    (a, _), (b, _), _ = split_host(gpus, {})
    assert (a.devices, b.devices) == ("0", "1")
    one = HostConfig(vllm_command=("vllm", "serve"), devices="0")
    (_, ca), (_, cb), _ = split_host(one, {"gpu_memory_utilization": 0.9})
    assert ca["gpu_memory_utilization"] == cb["gpu_memory_utilization"] == 0.45


# --- vLLM's development endpoints (issue #31, item 4) --------------------------------------------


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.1.2.3", "gpu-a.internal"])
def test_it_refuses_development_mode_on_a_bind_other_than_loopback(bind):
    host = HostConfig(vllm_command=("vllm", "serve"), bind_host=bind, extra_env={"VLLM_SERVER_DEV_MODE": "1"})
    with pytest.raises(LaunchError) as refused:
        launch(host=host)
    assert refused.value.name == "bind_host"
    message = str(refused.value)
    assert f"binds {bind}" in message and "loopback" in message and "/reset_prefix_cache" in message
    assert "TAILTUNE_BIND_HOST" in message


def test_it_refuses_development_mode_from_the_inherited_environment_too():
    host = HostConfig(vllm_command=("vllm", "serve"), bind_host="0.0.0.0")
    with pytest.raises(LaunchError, match="loopback"):
        build_launch(
            model="/models/tiny", cell_args=CELL, controls=CONTROLS, host=host, port=8123,
            base_env={"VLLM_SERVER_DEV_MODE": "1"},
        )  # fmt: skip
    # Off is off: "0" is how vLLM reads it.
    plan = build_launch(
        model="/models/tiny", cell_args=CELL, controls=CONTROLS, host=host, port=8123,
        base_env={"VLLM_SERVER_DEV_MODE": "0"},
    )  # fmt: skip
    assert plan.host == "0.0.0.0"


@pytest.mark.parametrize("bind", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_it_turns_development_mode_on_for_a_loopback_bind_only_when_asked(bind):
    plan = launch(host=HostConfig(vllm_command=("vllm", "serve"), bind_host=bind, dev_mode=True))
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1" and f"--host={bind}" in plan.argv
    assert "VLLM_SERVER_DEV_MODE" not in launch(host=HostConfig(vllm_command=("vllm", "serve"))).env


def test_a_server_without_development_mode_may_bind_any_address():
    plan = launch(host=HostConfig(vllm_command=("vllm", "serve"), bind_host="0.0.0.0"))
    assert "--host=0.0.0.0" in plan.argv and "VLLM_SERVER_DEV_MODE" not in plan.env


# --- model paths (issue #31, item 10): the worker checks its own roots before a server starts ----


def test_it_refuses_a_model_path_with_a_parent_component():
    with pytest.raises(LaunchError) as refused:
        build_launch(
            model="/models/../etc", cell_args=CELL, controls=CONTROLS, host=HOST, port=8123, base_env={}
        )
    assert refused.value.name == "model" and "'..'" in str(refused.value)


def test_it_refuses_a_model_outside_the_hosts_roots_whether_or_not_it_exists(tmp_path):
    import dataclasses

    root = tmp_path / "models"
    (root / "tiny").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "escape").symlink_to(tmp_path / "elsewhere")
    host = dataclasses.replace(HOST, model_roots=(str(root),))

    def refusal(model):
        with pytest.raises(LaunchError) as refused:
            build_launch(model=model, cell_args=CELL, controls=CONTROLS, host=host, port=8123, base_env={})
        assert refused.value.name == "model"
        return str(refused.value).replace(model, "<path>")

    existing, missing = refusal(str(tmp_path / "elsewhere")), refusal(str(tmp_path / "nowhere"))
    assert existing == missing == refusal(str(root / "escape")) and str(root) in existing
    assert "--model=" + str(root / "tiny") in launch_model(str(root / "tiny"), host).argv


def launch_model(model, host):
    return build_launch(model=model, cell_args=CELL, controls=CONTROLS, host=host, port=8123, base_env={})
