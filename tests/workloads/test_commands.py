from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.workloads.tracefile import trace_loads, trace_sha256
from tests.conftest import SEED_SPEC
from tests.workloads.conftest import FIXTURES


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_it_prints_azure_stats_as_one_json_object(azure_conv: Path) -> None:
    stats = json.loads(_run("trace_stats", str(azure_conv), "--format", "azure"))
    assert stats["requests"] == 19_366
    assert stats["input_tokens"]["max"] == 14050


@pytest.mark.parametrize(
    ("name", "fmt", "requests"),
    [
        ("azure_2024.csv", "azure", 3),
        ("burstgpt_v2.csv", "burstgpt", 3),
        ("mooncake.jsonl", "mooncake", 3),
        ("vllm_timed.jsonl", "vllm-timed", 3),
    ],
)
def test_it_reads_every_import_format(name: str, fmt: str, requests: int) -> None:
    stats = json.loads(_run("trace_stats", str(FIXTURES / name), "--format", fmt))
    assert stats["requests"] == requests


def test_it_reports_a_bad_file_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,x\n")
    with pytest.raises(CommandError, match="line 2: GeneratedTokens must be a whole number"):
        _run("trace_stats", str(bad), "--format", "azure")
    with pytest.raises(CommandError, match="import limit"):
        _run("trace_stats", str(bad), "--format", "azure", "--max-bytes", "10")


@pytest.fixture
def spec_file(tmp_path: Path, tokenizer_dir: Path) -> Path:
    spec = yaml.safe_load(SEED_SPEC.read_text())
    spec["model"]["path"] = str(tokenizer_dir)
    # Small classes and a short window: the same code path, seconds not minutes.
    spec["classes"][0]["input_tokens"] = 32
    spec["classes"][1]["input_tokens"] = 200
    spec["workload"]["observation_s"] = 20
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_it_generates_the_same_trace_hash_for_the_same_spec_and_seed(spec_file: Path, tmp_path: Path) -> None:
    args = ["trace_generate", "--spec", str(spec_file), "--mixture", "80-20", "--rate", "low"]
    first = _run(*args, "--out", str(tmp_path / "a.jsonl"))
    second = _run(*args, "--out", str(tmp_path / "b.jsonl"))
    other = _run(*args, "--seed", "1", "--out", str(tmp_path / "c.jsonl"))
    assert first == second != other
    data = (tmp_path / "a.jsonl").read_bytes()
    assert trace_sha256(data) == first
    assert (tmp_path / "b.jsonl").read_bytes() == data
    trace = trace_loads(data)
    assert trace.meta["seed"] == 20261129 and trace.meta["repeat"] == 1
    uniform = _run(*args, "--uniform", "--out", str(tmp_path / "u.jsonl"))
    assert uniform != first
    stats = json.loads(_run("trace_stats", str(tmp_path / "u.jsonl"), "--format", "tailtune"))
    assert stats["requests"] == len(trace.requests)
    assert stats["cv_iat"] < 1e-3


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--mixture", "90-10", "--rate", "low"], "--mixture '90-10'"),
        (["--mixture", "80-20", "--rate", "peak"], "--rate 'peak'"),
        (["--mixture", "80-20", "--rate", "low", "--repeat", "4"], "--repeat"),
    ],
)
def test_it_refuses_names_the_spec_does_not_have(spec_file: Path, tmp_path: Path, extra, fragment) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "t.jsonl"
    with pytest.raises(CommandError, match=fragment):
        _run("trace_generate", "--spec", str(spec_file), *extra, "--out", str(out))
    assert not out.exists()


def test_it_refuses_an_invalid_spec(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    with pytest.raises(CommandError, match="model"):
        _run(
            "trace_generate",
            "--spec",
            str(bad),
            "--mixture",
            "m",
            "--rate",
            "r",
            "--out",
            str(tmp_path / "o"),
        )
