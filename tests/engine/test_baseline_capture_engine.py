"""``manage.py baseline_capture`` against a running CPU vLLM started with non-default flags, and a
Deployment read by the engine's own vLLM parser (#34 item 1).

One server start: "production", started by tailtune's own launcher with a KV-cache size, a
KV-cache block size, two scheduler flags that are not vLLM's defaults and two flags tailtune never
varies (eager mode, the logprobs cap). The same server shows the flag catalogue's pass-through
(tests/engine/test_vllm_flags_engine.py's other half): each flag is written into the argv, vLLM's
"non-default args" line confirms it, and the block size is in vllm:cache_config_info too.

1. Captured from its URL, B0 holds what a server shows: the block size (an arg), the KV cache's
   size, the context length and prefix caching (controls), and the record says the scheduler's
   flags are not visible there.
2. Captured from the command line it was started with, B0's args equal every flag it was given.
3. The sweep's launcher, given that B0, builds the very argv this server runs (but its port), the
   engine confirms every arg (the check each sweep run makes on its own B0 server), and the
   manifest's effective args carry them.
4. A Deployment's vLLM container, its env expanded, parsed by vLLM's parser: its flags split into
   args, controls and what only that server needs; a flag vLLM 0.32 does not have (--swap-space)
   is refused in vLLM's own words. Each parse imports vLLM in the engine's interpreter (seconds).
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from apps.approvals import manifest as mf
from apps.approvals.capture_sources import baseline_capture
from apps.experiments.spec import SpecError, validate_spec
from tests.engine_support import CONTROLS, ENGINE_DIR, ENGINE_MARKS, MODEL
from tests.experiments.factories import small_spec
from workers.engine.launcher import build_launch, cpu_engine_host
from workers.engine.server import EngineServer

pytestmark = ENGINE_MARKS

# Production's flags beside tailtune's controls (6 MiB of KV cache, 4096 tokens, bfloat16).
FLAGS = {
    "block_size": 64,
    "max_num_seqs": 5,
    "max_num_batched_tokens": 1024,
    "enforce_eager": True,
    "max_logprobs": 5,
}


# The options the capture carries into the sweep's B0 (the rest are the sweep's own: its port,
# its served name, controls the spec sets whatever production did).
CARRIED = (
    "--block-size",
    "--enforce-eager",
    "--max-logprobs",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--kv-cache-memory-bytes",
    "--max-model-len",
    "--dtype",
    "--no-enable-prefix-caching",
    "--model",
    "--revision",
    "--tokenizer-revision",
)


def _launched(argv: list[str]) -> list[str]:
    return sorted(a for a in argv if a.split("=")[0] in CARRIED)


def _capture(**options: str) -> tuple[dict, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("baseline_capture", stdout=out, stderr=err, **options)
    return yaml.safe_load(out.getvalue()), err.getvalue()


def test_baseline_capture_reads_a_running_server_and_its_command_line(tmp_path: Path) -> None:
    server = EngineServer(
        model=str(MODEL),
        cell_args=FLAGS,
        controls=CONTROLS,
        host=cpu_engine_host(ENGINE_DIR),
        log_path=tmp_path / "production.log",
        health_deadline_s=240,
    )
    # Flags tailtune never varies pass through to the argv as they are.
    assert {"--block-size=64", "--enforce-eager", "--max-logprobs=5"} <= set(server.plan.argv)
    with server:
        server.start()
        own = server.confirm()  # raises EngineInvalid on any difference
        assert {k: own.effective_args[k] for k in FLAGS} == FLAGS
        logged = own.effective_args["vllm_non_default_args"]
        assert (logged["block_size"], logged["enforce_eager"], logged["max_logprobs"]) == (64, True, 5)
        assert own.effective_args["cache_config_info"]["block_size"] == "64"

        # 1. Its URL: what /v1/models and /metrics show.
        frag, notes = _capture(url=server.base_url)
        assert frag["baseline"]["args"] == {"block_size": 64}
        assert frag["controls"] == {
            "max_model_len": CONTROLS["max_model_len"],
            "kv_cache_memory_bytes": CONTROLS["kv_cache_memory_bytes"],
            "enable_prefix_caching": CONTROLS["enable_prefix_caching"],
        }
        assert frag["model"] == {"path": str(MODEL)}
        record = frag["baseline"]["capture"]
        assert (record["source"], record["name"], record["vllm_version"]) == (
            "server",
            server.base_url,
            "0.32.0",
        )
        assert len(record["sha256"]) == 64 and "max_num_seqs" in record["notes"][0]
        assert "not visible" in notes

        # 2. The command line it runs: every flag.
        command = shlex.join(["vllm", "serve", *server.plan.argv[3:]])
        frag, notes = _capture(command_line=command)
        assert frag["baseline"]["args"] == FLAGS
        assert frag["controls"] == {
            "dtype": CONTROLS["dtype"],
            "max_model_len": CONTROLS["max_model_len"],
            "kv_cache_memory_bytes": CONTROLS["kv_cache_memory_bytes"],
            "enable_prefix_caching": CONTROLS["enable_prefix_caching"],
        }
        assert frag["model"] == {
            "path": str(MODEL),
            "revision": CONTROLS["revision"],
            "tokenizer_revision": CONTROLS["tokenizer_revision"],
        }
        assert "port:" in notes and "served_model_name:" in notes  # left out, and said so

        # 3. The spec's B0 as the sweep launches it: the same argv, confirmed by the engine.
        spec = small_spec()
        spec["controls"] = {**spec["controls"], **frag["controls"]}
        spec["baseline"] = frag["baseline"]
        checked = validate_spec(spec)
        assert checked["baseline"]["args"] == FLAGS and checked["baseline"]["capture"]["source"] == "command"
        controls = {**CONTROLS, **{k: v for k, v in checked["controls"].items() if v is not None}}
        plan = build_launch(
            model=str(MODEL),
            cell_args=checked["baseline"]["args"],
            controls=controls,
            host=cpu_engine_host(ENGINE_DIR),
            port=server.plan.port,
        )
        assert _launched(plan.argv) == _launched(server.plan.argv)
        facts = server.confirm()  # EngineInvalid on any difference
    effective = mf.effective_args(checked["baseline"]["args"], [facts.effective_args])
    assert effective["source"] == mf.CONFIRMED
    assert {k: effective["args"][k] for k in FLAGS} == FLAGS
    assert {k: effective["args"]["vllm_non_default_args"][k] for k in FLAGS} == FLAGS


@pytest.fixture(autouse=True)
def _no_capture_servers(settings):  # type: ignore[no-untyped-def]
    settings.TAILTUNE_CAPTURE_SOURCES = {}


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: llm, namespace: prod}
spec:
  template:
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.32.0
          env: [{name: SEQS, value: "48"}]
          args:
            - /models/tiny
            - --max-num-seqs=$(SEQS)
            - --block-size=32
            - --kv-cache-memory-bytes=6291456
            - --max-model-len=2048
            - --enable-prefix-caching
            - --port=9000
            - --api-key=sk-not-for-a-spec
"""


def test_a_deployment_is_read_by_vllms_own_parser() -> None:
    deployment = baseline_capture(source="kubernetes", text=DEPLOYMENT)
    assert deployment.args == {"max_num_seqs": 48, "block_size": 32}
    assert deployment.controls == {
        "kv_cache_memory_bytes": 6291456,
        "max_model_len": 2048,
        "enable_prefix_caching": True,
    }
    assert deployment.model == {"path": "/models/tiny"} and deployment.image == "vllm/vllm-openai:v0.32.0"
    assert deployment.capture["vllm_version"] == "0.32.0"
    assert sorted(n.split(":")[0] for n in deployment.notes) == ["api_key", "port"]
    assert deployment.capture["name"] == "Deployment/prod/llm container vllm"
    assert deployment.capture["sha256"] == hashlib.sha256(DEPLOYMENT.encode()).hexdigest()
    assert "sk-not-for-a-spec" not in json.dumps(deployment.capture)


def test_a_flag_the_engine_does_not_have_is_refused_in_vllms_words() -> None:
    with pytest.raises(SpecError) as info:
        baseline_capture(source="command", text="vllm serve /m --max-num-seqs 8 --swap-space 16")
    (error,) = info.value.errors
    assert error.path == "text" and "unrecognized arguments: --swap-space" in error.message
