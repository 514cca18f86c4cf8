"""The pure manifest module: digest, overlay semantics, effective args, YAML = JSON."""

from __future__ import annotations

import json

import yaml

from apps.approvals import manifest as mf

BASELINE = {
    "cell_id": "B0",
    "effective_args": {"args": {"max_num_batched_tokens": 8192, "max_num_seqs": 64}, "source": mf.CONFIRMED},
    "drain_deadline_seconds": 60,
}
CANDIDATE = {
    "cell_id": "C3",
    "effective_args": {"args": {"max_num_batched_tokens": 4096, "max_num_seqs": 64}, "source": mf.CONFIRMED},
}


def _doc(candidate=CANDIDATE):  # type: ignore[no-untyped-def]
    content = mf.build_manifest(
        baseline=BASELINE,
        candidate=candidate,
        evidence={"experiment": {"id": 1}},
        approval={"approver": "ada"},
    )
    return mf.document(content, mf.content_sha256(content))


def test_it_verifies_its_own_digest_and_detects_tampering() -> None:
    doc = _doc()
    assert mf.verify(doc)
    doc["baseline"]["effective_args"]["args"]["max_num_seqs"] = 128
    assert not mf.verify(doc)


def test_it_keeps_the_baseline_record_whole_and_the_candidate_as_an_overlay() -> None:
    doc = _doc()
    assert doc["baseline"] == BASELINE
    assert doc["overlay"]["cell_id"] == "C3"
    assert doc["overlay"]["applies_to"] == "B0"
    assert doc["overlay"]["changes"] == {"max_num_batched_tokens": {"baseline": 8192, "candidate": 4096}}


def test_it_has_no_overlay_when_b0_itself_is_approved() -> None:
    assert _doc(candidate=None)["overlay"] is None


def test_it_writes_the_same_content_as_yaml_and_json() -> None:
    doc = _doc()
    assert yaml.safe_load(mf.to_yaml(doc)) == json.loads(mf.to_json(doc)) == doc


def test_it_prefers_the_engines_confirmed_args_and_marks_a_fallback() -> None:
    requested = {"max_num_seqs": 8}
    fallback = mf.effective_args(requested, [None, None])
    assert fallback == {"args": requested, "source": mf.REQUESTED, "confirmed_runs": 0, "distinct": 0}
    full = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "max_model_len": 4096}
    odd = {**full, "max_num_seqs": 9}
    confirmed = mf.effective_args(requested, [full, None, odd, full])
    assert confirmed["args"] == full
    assert confirmed["source"] == mf.CONFIRMED
    assert (confirmed["confirmed_runs"], confirmed["agreeing_runs"], confirmed["distinct"]) == (3, 2, 2)


def test_it_hashes_independently_of_key_order() -> None:
    a = {"b": 1, "a": {"y": 2, "x": 3}}
    b = {"a": {"x": 3, "y": 2}, "b": 1}
    assert mf.content_sha256(a) == mf.content_sha256(b)


def test_values_local_to_the_test_run_are_kept_apart_and_do_not_split_the_vote() -> None:
    # Each run's server listened on a port of its own and traced to its worker's span receiver.
    spans = "http://127.0.0.1:{}/v1/traces"
    run = {
        "max_num_seqs": 8,
        "served_model_name": "tiny",
        "vllm_non_default_args": {
            "port": 41129,
            "max_num_seqs": 8,
            "otlp_traces_endpoint": spans.format(41130),
        },
    }
    other = {
        **run,
        "vllm_non_default_args": {
            "port": 52001,
            "max_num_seqs": 8,
            "otlp_traces_endpoint": spans.format(52002),
        },
    }
    eff = mf.effective_args({"max_num_seqs": 8}, [run, other])
    assert eff["args"] == {"max_num_seqs": 8, "vllm_non_default_args": {"max_num_seqs": 8}}
    assert eff["test_run_only"] == {
        "served_model_name": "tiny",
        "vllm_non_default_args.port": 41129,
        "vllm_non_default_args.otlp_traces_endpoint": spans.format(41130),
    }
    assert (eff["confirmed_runs"], eff["agreeing_runs"], eff["distinct"]) == (2, 2, 1)
    assert "port" not in json.dumps(eff["args"]) and "traces" not in json.dumps(eff["args"])


def test_the_complete_args_are_the_defaults_under_what_the_engine_confirmed_and_logged() -> None:
    defaults = {"scheduling_policy": "fcfs", "swap_space": 4, "port": 8000, "max_num_seqs": None}
    flags = {"scheduling_policy", "swap_space", "port", "max_num_seqs", "max_num_batched_tokens"}
    args = {
        "max_num_batched_tokens": 2048,  # confirmed and a flag
        "kv_cache_size_tokens": 32768,  # confirmed, but no flag of the parser
        "vllm_non_default_args": {"swap_space": 16, "max_num_seqs": 8, "port": 38001},
    }
    assert mf.complete_args(args, defaults, flags) == {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 8,  # None in the parser: present because the server set it
        "scheduling_policy": "fcfs",
        "swap_space": 16,
    }
