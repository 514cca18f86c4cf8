"""B0 captured (apps/experiments/baseline_capture.py and spec_capture.py): what a server's answers,
a parsed command line and an approved manifest become, the split into model, controls and args,
the capture record in the spec, and the spec it makes."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import httpx
import pytest

from apps.approvals import manifest as mf
from apps.experiments import baseline_capture as bc
from apps.experiments.spec import SpecError, dump_spec, parse_spec, validate_spec
from apps.experiments.spec_capture import TYPED_BY_HAND, b0_origin
from tests.experiments.factories import SMALL_SPEC
from workers.engine import vllm_args

METRICS = (Path(__file__).resolve().parents[1] / "engine" / "fixtures" / "vllm-0.32-metrics.txt").read_text()
MODELS = {
    "object": "list",
    "data": [{"id": "tiny", "root": "/m/tiny-llama", "max_model_len": 4096, "parent": None}],
}
AT = "2025-01-31T09:00:00+00:00"


def _metrics(**labels: str) -> bytes:
    """The recorded vLLM 0.32 /metrics with some cache_config_info labels set otherwise."""
    text = METRICS
    for key, value in labels.items():
        text, n = re.subn(rf'([{{,]){key}="[^"]*"', rf'\g<1>{key}="{value}"', text)
        assert n == 1, key
    return text.encode()


def _bodies(**labels: str) -> dict[str, bytes]:
    return {
        "/v1/models": json.dumps(MODELS).encode(),
        "/metrics": _metrics(**labels),
        "/version": b'{"version":"0.32.0"}',
    }


def _split(parsed: dict, model: str | None = "/m") -> tuple:
    return bc.split_args(
        model, parsed, field_name="text", check_arg=vllm_args.check_arg, denied=vllm_args.DENIED
    )


def test_a_server_gives_its_model_its_length_and_the_cache_flags_it_was_started_with() -> None:
    bodies = _bodies(
        block_size="32", user_specified_block_size="True", cache_dtype="fp8", enable_prefix_caching="True"
    )
    captured = bc.from_server(bodies, name="prod", defaults=vllm_args.catalogue().defaults(), at=AT)
    assert captured.model == {"path": "/m/tiny-llama"}
    assert captured.controls == {
        "max_model_len": 4096,
        "kv_cache_memory_bytes": 67108864,
        "enable_prefix_caching": True,
    }
    assert captured.args == {"block_size": 32, "kv_cache_dtype": "fp8"}
    assert captured.capture["source"] == "server" and captured.capture["vllm_version"] == "0.32.0"
    assert captured.capture["captured_at"] == AT
    # What it cannot see is said, in the record itself.
    assert "max_num_seqs" in captured.capture["notes"][0]


def test_a_server_left_at_vllms_defaults_gives_no_args_and_not_the_values_the_engine_worked_out() -> None:
    captured = bc.from_server(_bodies(), name="prod", defaults=vllm_args.catalogue().defaults(), at=AT)
    # block_size="128" and mamba_ssm_cache_dtype="float32" are the engine's own choices, not flags.
    assert captured.args == {}
    assert captured.controls["enable_prefix_caching"] is False


def test_the_servers_digest_is_of_the_bodies_as_read_in_a_stated_order() -> None:
    bodies = _bodies()
    expected = hashlib.sha256()
    for path in ("/v1/models", "/metrics", "/version"):
        expected.update(f"{path}\n{len(bodies[path])}\n".encode() + bodies[path] + b"\n")
    captured = bc.from_server(bodies, name="prod", defaults={}, at=AT)
    assert captured.capture["sha256"] == expected.hexdigest()
    assert (
        bc.from_server({**bodies, "/metrics": bodies["/metrics"] + b"\n"}, name="p", defaults={}).capture[
            "sha256"
        ]
        != expected.hexdigest()
    )


@pytest.mark.parametrize(
    ("bodies", "message"),
    [
        ({"/v1/models": b"<html>", "/metrics": b""}, "not the model list"),
        ({"/v1/models": json.dumps({"data": []}).encode(), "/metrics": b""}, "lists 0 base models"),
        ({"/v1/models": json.dumps(MODELS).encode(), "/metrics": b"up 1\n"}, "no vllm:cache_config_info"),
    ],
)
def test_a_server_that_is_not_a_vllm_server_is_an_error_naming_the_server(bodies: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        bc.from_server(bodies, name="x", defaults={})
    assert info.value.errors[0].path == "server"


def test_fetching_a_server_follows_no_redirect_and_names_what_failed() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(302, headers={"location": "http://169.254.169.254/"})
        return httpx.Response(200, content=b"")

    with pytest.raises(SpecError, match=r"/v1/models answered HTTP 302"):
        bc.fetch_server("http://prod:8000", transport=httpx.MockTransport(answer))

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(SpecError, match="did not answer /v1/models: ConnectError"):
        bc.fetch_server("http://prod:8000", transport=httpx.MockTransport(down))

    def ok(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            return httpx.Response(404)
        return httpx.Response(200, content=_bodies()[request.url.path])

    assert set(bc.fetch_server("http://prod:8000/", transport=httpx.MockTransport(ok))) == {
        "/v1/models",
        "/metrics",
    }


def test_the_split_puts_controls_revisions_and_args_apart_and_drops_where_the_server_listened() -> None:
    model, controls, args, notes = _split(
        {
            "max_model_len": 4096,
            "dtype": "bfloat16",
            "revision": "abc",
            "tokenizer_revision": "abc",
            "port": 8000,
            "host": "0.0.0.0",
            "served_model_name": ["llama"],
            "api_key": "sk-very-secret",
            "max_num_seqs": 64,
            "block_size": 32,
            "kv_cache_dtype": "fp8",
            # The deployment's collector: tailtune's launcher traces its own servers to the worker.
            "otlp_traces_endpoint": "http://otel.internal:4317",
        }
    )
    assert model == {"path": "/m", "revision": "abc", "tokenizer_revision": "abc"}
    assert controls == {"max_model_len": 4096, "dtype": "bfloat16"}
    assert args == {"max_num_seqs": 64, "block_size": 32, "kv_cache_dtype": "fp8"}
    assert any(n.startswith("api_key: a secret") for n in notes) and "sk-very-secret" not in " ".join(notes)
    assert any(n.startswith("port:") for n in notes)
    assert any(n.startswith("otlp_traces_endpoint:") for n in notes)


def test_the_split_names_every_denied_or_unusable_flag_at_once() -> None:
    with pytest.raises(SpecError) as info:
        _split({"trust_remote_code": True, "chat_template": "/etc/t.jinja", "max_num_seqs": 0.5})
    messages = [e.message for e in info.value.errors]
    assert {e.path for e in info.value.errors} == {"text"}
    assert any("trust_remote_code" in m and "runs Python code" in m for m in messages)
    assert any("chat_template" in m for m in messages)
    assert any("max_num_seqs" in m and "integer" in m for m in messages)


def _manifest(*, overlay: bool) -> tuple[dict, bytes]:
    confirmed = {
        "args": {
            "max_num_seqs": 8,
            "max_model_len": 2048,
            "block_size": "128",  # the engine's report, not a flag
            "vllm_non_default_args": {
                "model": "/m/tiny-llama",
                "port": 41000,
                "host": "127.0.0.1",
                "served_model_name": ["tiny"],
                "dtype": "bfloat16",
                "max_model_len": 2048,
                "revision": "r1",
                "kv_cache_memory_bytes": 33554432,
                "max_num_seqs": 8 if not overlay else 16,
                "block_size": 32,
            },
        },
        "source": mf.CONFIRMED,
        "confirmed_runs": 3,
        "distinct": 1,
    }
    baseline = {
        "cell_id": "B0",
        "image": "vllm-cpu:0.32.0",
        "vllm_version": "0.32.0",
        "model": {"path": ".engine/models/tiny-llama", "revision": "r1"},
        "tokenizer_revision": "r1",
        "effective_args": confirmed,
        "controls": {
            "dtype": "bfloat16",
            "max_model_len": 2048,
            "kv_cache_memory_bytes": 33554432,
            "gpu_memory_utilization": None,
            "enable_prefix_caching": False,
            "seed": 0,
        },
    }
    content = mf.build_manifest(
        baseline=baseline,  # type: ignore[arg-type]
        candidate={"cell_id": "C1", "effective_args": confirmed} if overlay else None,  # type: ignore[typeddict-item]
        evidence={"experiment": {"id": 4, "name": "x"}},  # type: ignore[typeddict-item]
        approval={"verdict": "approved"},  # type: ignore[typeddict-item]
    )
    doc = mf.document(content, mf.content_sha256(content))
    return doc, mf.render(doc, "json")  # type: ignore[arg-type]


@pytest.mark.parametrize("overlay", [False, True])
def test_a_manifest_gives_the_approved_cell_as_the_engine_confirmed_it(overlay: bool) -> None:
    doc, raw = _manifest(overlay=overlay)
    captured = bc.from_manifest(doc, raw, name="experiment 4", at=AT)
    assert captured.args == {"max_num_seqs": 16 if overlay else 8, "block_size": 32}
    assert captured.controls == {
        "dtype": "bfloat16",
        "max_model_len": 2048,
        "kv_cache_memory_bytes": 33554432,
        "enable_prefix_caching": False,
        "seed": 0,
    }
    assert captured.model == {
        "path": ".engine/models/tiny-llama",
        "revision": "r1",
        "tokenizer_revision": "r1",
    }
    assert captured.image == "vllm-cpu:0.32.0"
    assert captured.capture["sha256"] == hashlib.sha256(raw).hexdigest()
    assert captured.capture["source"] == "manifest" and captured.capture["vllm_version"] == "0.32.0"


def _captured() -> bc.Captured:
    model, controls, args, notes = _split(
        {"max_model_len": 2048, "kv_cache_memory_bytes": 33554432, "max_num_seqs": 16, "block_size": 32},
        model="/prod/models/tiny",
    )
    record = bc._record("command", "command line", "ab" * 32, "0.32.0", notes, AT)
    return bc.Captured(
        model=model, controls={**controls, "enable_prefix_caching": True}, args=args, capture=record
    )


def test_a_spec_with_the_capture_validates_and_round_trips_through_yaml() -> None:
    spec, notes = bc.apply_to_spec(copy.deepcopy(SMALL_SPEC), _captured(), note="prod, 2025-01-31")
    assert notes == [
        "model.path: kept '.engine/models/tiny-llama'; the deployment serves '/prod/models/tiny' "
        "(check that they are the same model)"
    ]
    checked = validate_spec(spec)
    baseline = checked["baseline"]
    assert baseline["args"] == {"max_num_seqs": 16, "block_size": 32}
    assert baseline["captured_from"] == "prod, 2025-01-31"
    assert baseline["capture"] == {
        "source": "command",
        "name": "command line",
        "captured_at": AT,
        "sha256": "ab" * 32,
        "vllm_version": "0.32.0",
    }
    assert checked["controls"]["enable_prefix_caching"] is True
    assert checked["controls"]["dtype"] == "bfloat16"  # the spec's, where the capture said nothing
    again = parse_spec(dump_spec(checked))
    assert again["baseline"] == baseline
    assert b0_origin(again["baseline"]).startswith(
        "B0 captured from command command line at 2025-01-31T09:00:00"
    )


def test_the_fragment_says_where_b0_came_from_and_a_spec_without_it_is_typed_by_hand() -> None:
    frag = bc.fragment(_captured(), baseline_id="B0")
    assert frag["baseline"]["captured_from"] == "command: command line"
    assert frag["baseline"]["capture"]["sha256"] == "ab" * 32
    assert b0_origin(validate_spec(copy.deepcopy(SMALL_SPEC))["baseline"]) == TYPED_BY_HAND


@pytest.mark.parametrize(
    ("capture", "field"),
    [
        ({"source": "ftp", "name": "x", "captured_at": AT, "sha256": "ab" * 32}, "baseline.capture.source"),
        (
            {"source": "server", "name": "x", "captured_at": AT, "sha256": "AB" * 32},
            "baseline.capture.sha256",
        ),
        (
            {"source": "server", "name": "x", "captured_at": "2025-01-31T09:00", "sha256": "ab" * 32},
            "baseline.capture.captured_at",
        ),
        (
            {"source": "server", "name": "x", "captured_at": AT, "sha256": "ab" * 32, "by": "me"},
            "baseline.capture.by",
        ),
        ({"source": "server", "captured_at": AT, "sha256": "ab" * 32}, "baseline.capture.name"),
        (
            {"source": "server", "name": "x", "captured_at": AT, "sha256": "ab" * 32, "notes": ["\ud800"]},
            "baseline.capture.notes",
        ),
    ],
)
def test_a_bad_capture_record_is_a_field_error(capture: dict, field: str) -> None:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["baseline"]["capture"] = capture
    with pytest.raises(SpecError) as info:
        validate_spec(spec)
    assert field in {e.path for e in info.value.errors}
