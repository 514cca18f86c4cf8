"""Where a deployment's text starts vLLM (apps/experiments/deployment_text.py): the argv found in a
command line, a Kubernetes manifest and Helm values, before vLLM's own parser reads it."""

from __future__ import annotations

import pytest

from apps.experiments.deployment_text import (
    DeploymentTextError,
    from_command_line,
    from_helm_values,
    from_kubernetes,
)

DEPLOYMENT = """\
apiVersion: v1
kind: Service
metadata: {name: llm}
spec: {ports: [{port: 8000}]}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llm
  namespace: prod
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: log-shipper
          image: fluent/fluent-bit:3.0
        - name: vllm
          image: vllm/vllm-openai:v0.32.0
          env:
            - {name: MODEL, value: /models/llama-8b}
            - {name: HF_TOKEN, valueFrom: {secretKeyRef: {name: hf, key: token}}}
          command: ["vllm", "serve"]
          args:
            - $(MODEL)
            - --max-num-seqs=64
            - --block-size
            - "32"
            - --kv-cache-memory-bytes=6291456
"""


def test_it_reads_a_command_line_with_continuations_comments_and_env_prefixes() -> None:
    start = from_command_line(
        "# production B0, 2025-01\n"
        "VLLM_USE_V1=1 vllm serve /models/llama-8b \\\n"
        "  --max-num-seqs 64 \\\n"
        "  --served-model-name 'llama 8b'  # the router's name\n"
    )
    assert start.argv == ("/models/llama-8b", "--max-num-seqs", "64", "--served-model-name", "llama 8b")
    assert start.where == "command line"


@pytest.mark.parametrize(
    ("text", "argv"),
    [
        ("/opt/venv/bin/vllm serve m --port 8000", ("m", "--port", "8000")),
        ("python3 -m vllm.entrypoints.openai.api_server --model m", ("--model", "m")),
        ("cd /srv && exec vllm serve m --max-num-seqs=8 | tee log", ("m", "--max-num-seqs=8")),
        (
            "docker run --gpus all -p 8000:8000 -v /m:/m vllm/vllm-openai:v0.32.0 --model /m --block-size 32",
            ("--model", "/m", "--block-size", "32"),
        ),
        ("podman run --rm registry.local/vllm/vllm-openai@sha256:" + "a" * 64 + " m", ("m",)),
        ("docker run -v /data:/data/vllm --gpus all vllm/vllm-openai:v0.32.0 --model /m", ("--model", "/m")),
        ("python -m vllm.entrypoints.cli.main serve /m --max-num-seqs 4", ("/m", "--max-num-seqs", "4")),
    ],
)
def test_it_finds_the_arguments_after_every_way_of_starting_vllm(text: str, argv: tuple[str, ...]) -> None:
    assert from_command_line(text).argv == argv


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("python train.py --epochs 3", "no vLLM start found"),
        ("vllm serve a && vllm serve b", "starts vLLM 2 times"),
        ("vllm serve 'unclosed", "cannot be split into words"),
    ],
)
def test_a_command_line_that_starts_no_single_vllm_says_so(text: str, message: str) -> None:
    with pytest.raises(DeploymentTextError, match=message):
        from_command_line(text)


def test_it_reads_the_vllm_container_of_a_deployment_expanding_its_env() -> None:
    start = from_kubernetes(DEPLOYMENT)
    assert start.argv == (
        "/models/llama-8b",
        "--max-num-seqs=64",
        "--block-size",
        "32",
        "--kv-cache-memory-bytes=6291456",
    )
    assert start.where == "Deployment/prod/llm container vllm"
    assert start.image == "vllm/vllm-openai:v0.32.0"


def test_it_reads_a_pod_whose_vllm_image_gets_only_args_or_a_shell_script() -> None:
    pod = """\
kind: Pod
metadata: {name: b0}
spec:
  containers:
    - name: server
      image: vllm/vllm-openai:latest
      args: ["--model", "/m", "--max-num-batched-tokens", "4096"]
"""
    assert from_kubernetes(pod).argv == ("--model", "/m", "--max-num-batched-tokens", "4096")
    script = """\
kind: StatefulSet
metadata: {name: llm}
spec:
  template:
    spec:
      containers:
        - name: main
          image: python:3.11
          env: [{name: SEQS, value: "48"}]
          command: ["/bin/bash", "-c"]
          args: ["pip list && vllm serve /m --max-num-seqs ${SEQS} --enable-chunked-prefill"]
"""
    assert from_kubernetes(script).argv == ("/m", "--max-num-seqs", "48", "--enable-chunked-prefill")


@pytest.mark.parametrize(
    ("text", "container", "message"),
    [
        ("kind: Service\nmetadata: {name: x}\n", None, r"no Deployment.*kinds found: Service"),
        (
            "kind: Pod\nspec:\n  containers:\n    - {name: app, image: nginx, args: [serve]}\n",
            None,
            "no container in the manifest starts vLLM",
        ),
        ("kind: Deployment\nspec: [unclosed\n", None, "line 3: the manifest is not valid YAML"),
        (DEPLOYMENT, "sidecar", r"no vLLM container named 'sidecar'.*container vllm"),
        (
            "kind: Pod\nspec:\n  containers:\n"
            "    - {name: a, command: [vllm, serve, /m]}\n    - {name: b, command: [vllm, serve, /n]}\n",
            None,
            r"2 containers in the manifest start vLLM.*name the one",
        ),
        (
            "kind: Pod\nspec:\n  containers:\n    - name: a\n      env: [{name: M, valueFrom: {x: 1}}]\n"
            "      command: [sh, -c, 'vllm serve $M']\n",
            None,
            "M comes from a secret, config map or field",
        ),
    ],
)
def test_a_manifest_without_one_vllm_container_is_an_error_that_names_what_it_found(
    text: str, container: str | None, message: str
) -> None:
    with pytest.raises(DeploymentTextError, match=message):
        from_kubernetes(text, container=container)


def test_it_picks_the_named_container_where_several_start_vllm() -> None:
    text = (
        "kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
        "    - {name: a, command: [vllm, serve, /m]}\n    - {name: b, command: [vllm, serve, /n]}\n"
    )
    assert from_kubernetes(text, container="b").argv == ("/n",)


def test_it_finds_the_command_in_helm_values_as_a_container_or_a_string() -> None:
    values = """\
replicaCount: 2
server:
  name: vllm
  image: {repository: vllm/vllm-openai, tag: v0.32.0}
  extraArgs: ["/models/m", "--max-num-seqs", "32"]
  resources: {limits: {nvidia.com/gpu: 1}}
ingress: {enabled: false}
"""
    start = from_helm_values(values)
    assert start.argv == ("/models/m", "--max-num-seqs", "32")
    assert start.where == "values.server container vllm" and start.image == "vllm/vllm-openai:v0.32.0"
    as_string = 'engine:\n  startCommand: "vllm serve /models/m --block-size 32"\nother: serve me\n'
    found = from_helm_values(as_string)
    assert found.argv == ("/models/m", "--block-size", "32") and found.where == "values.engine.startCommand"


def test_helm_values_without_a_command_say_so() -> None:
    with pytest.raises(DeploymentTextError, match="no container in the values starts vLLM"):
        from_helm_values("modelSpec:\n  - {name: llama, vllmConfig: {maxModelLen: 4096}}\n")
    with pytest.raises(DeploymentTextError, match="one YAML mapping"):
        from_helm_values("- a\n- b\n")
