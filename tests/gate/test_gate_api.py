"""Starting a gate through the API and reading its verdict resource (real Postgres, no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.experiments.models import Experiment, TraceUpload
from apps.gate.uploads import gate_upload_import
from apps.workloads.models import Trace
from tests.experiments.factories import SMALL_SPEC, UserFactory
from tests.runs.factories import make_host
from workers.engine.tinymodel import build_tokenizer

pytestmark = pytest.mark.django_db
AZURE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("gate-model"))


def gate_file(model_dir: Path, **extra: object) -> str:
    doc = {
        "model": {**SMALL_SPEC["model"], "path": str(model_dir)},
        "controls": SMALL_SPEC["controls"],
        "baseline": {"captured_from": "prod", "args": {"max_num_batched_tokens": 2048, "max_num_seqs": 8}},
        "classes": [
            {"name": "short", "max_input_tokens": 1024, "contract": SMALL_SPEC["classes"][0]["contract"]},
            {"name": "long", "contract": SMALL_SPEC["classes"][1]["contract"]},
        ],
        **extra,
    }
    return yaml.safe_dump(doc)


def api_for(user) -> APIClient:  # type: ignore[no-untyped-def]
    _, plaintext = token_create(user=user, name="ci")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api


def post_gate(api: APIClient, **fields: object):  # type: ignore[no-untyped-def]
    with AZURE.open("rb") as trace:
        body = {"trace": trace, "format": "azure", "busiest": "20", **fields}
        return api.post("/api/v1/gates", body, format="multipart")


def imported(api: APIClient, response) -> dict:  # type: ignore[no-untyped-def]
    """The window the request stored, imported as the worker's task does; the upload resource after."""
    assert response.status_code == 202, response.content
    upload = response.json()
    assert upload["status"] == "queued" and response["Location"] == upload["url"] and "gate" not in upload
    gate_upload_import(upload_pk=upload["upload"])
    return dict(api.get(upload["url"]).json())


def start_gate(api: APIClient, **fields: object) -> dict:  # type: ignore[type-arg]
    """POST the gate, import its window, and return the started gate's verdict resource."""
    done = imported(api, post_gate(api, **fields))
    assert done["status"] == "done", done
    return dict(done["gate"])


def test_a_gate_starts_b0_and_the_overlaid_candidate_paired_on_the_window(model_dir: Path) -> None:
    make_host()
    author = UserFactory(roles=["experimenter"])
    api = api_for(author)
    posted = post_gate(
        api, spec=gate_file(model_dir), candidate_args=json.dumps({"max_num_seqs": 2}), repeats="2"
    )
    # The request stored the window and checked what needs none: nothing is cut or created yet.
    assert posted.status_code == 202 and Experiment.objects.count() == 0 and Trace.objects.count() == 0
    upload = imported(api, posted)
    assert upload["status"] == "done" and upload["bytes"] == AZURE.stat().st_size
    gate = upload["gate"]
    assert gate["verdict"] == "running" and gate["exit_code"] is None and gate["pass"] is False
    assert gate["url"].endswith(f"/experiments/{gate['gate']}/")
    experiment = Experiment.objects.get(pk=gate["gate"])
    assert experiment.status == "running" and experiment.owner == author
    cells = {c.cell_id: c.args for c in experiment.cells.all()}
    assert cells == {
        "B0": {"max_num_batched_tokens": 2048, "max_num_seqs": 8},
        "C1": {"max_num_batched_tokens": 2048, "max_num_seqs": 2},
    }
    w = experiment.workload
    trace = Trace.objects.get(sha256=w.imported_trace_sha256)
    assert w.arrival_process == "trace" and w.repeats == 2 and experiment.runs.count() == 4
    assert set(experiment.runs.values_list("trace_sha256", flat=True)) <= {"", trace.sha256}
    # The real arrival times are kept: the busiest 20 s, not stretched or squeezed.
    assert 19 <= trace.duration_s <= 20.5
    assert {c.name for c in experiment.classes.all()} == {"short", "long"}
    assert experiment.spec["recovery"] == {**experiment.spec["recovery"], "rehearse": False}
    # A changed candidate is a candidate, not the A/A control.
    assert not experiment.cells.get(cell_id="C1").control

    # A gate never stops its candidate early: the verdict names each regressed class with its
    # paired interval, which needs every repeat (early stopping would leave it inconclusive).
    assert experiment.spec["engine"]["early_stop"] is False and experiment.spec["engine"]["reuse"] is True
    assert experiment.spec["engine"]["stop_on_invalid"] is True

    # The resource a rollout controller polls: GET 200 always, POST (Flagger) 412 until it passes.
    assert api.get(f"/api/v1/gates/{gate['gate']}").json()["verdict"] == "running"
    _, plaintext = token_create(user=UserFactory(roles=["viewer"]), name="flagger")
    flagger = APIClient().post(
        f"/api/v1/gates/{gate['gate']}", {"name": "app", "metadata": {"token": plaintext}}, format="json"
    )
    assert flagger.status_code == 412 and flagger.json()["verdict"] == "running"
    wrong = APIClient().post(
        f"/api/v1/gates/{gate['gate']}", {"metadata": {"token": "tt_1_x"}}, format="json"
    )
    assert wrong.status_code == 401


@pytest.mark.parametrize(
    ("fields", "field", "when"),
    [
        ({"candidate_args": json.dumps({"max_num_seqs": 0})}, "candidate_args.max_num_seqs", "import"),
        ({"candidate_args": json.dumps({"max_model_len": 4096})}, "candidate_args.max_model_len", "import"),
        ({"candidate_args": "not json"}, "candidate_args", "request"),
        ({"repeats": "0"}, "repeats", "request"),
        ({"format": "csv"}, "format", "request"),
        ({"classes": "short:1024"}, "classes", "request"),
        ({"busiest": "-1"}, "busiest", "request"),
        ({"spec": "model: [unclosed"}, "spec", "request"),
    ],
)
def test_a_bad_field_is_named_and_nothing_is_saved(model_dir: Path, fields, field, when) -> None:  # type: ignore[no-untyped-def]
    """What needs no window is a 400 from the request; what does, the failed upload's errors."""
    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    response = post_gate(api, **{"spec": gate_file(model_dir), **fields})
    if when == "request":
        assert response.status_code == 400, response.content
        errors = response.json()["errors"]
        assert TraceUpload.objects.count() == 0
    else:
        failed = imported(api, response)
        assert failed["status"] == "failed", failed
        errors = failed["errors"]
    assert field in {e["field"] for e in errors}, errors
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0


def test_a_bad_trace_line_is_named_and_nothing_is_saved(model_dir: Path, tmp_path: Path) -> None:
    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    bad = tmp_path / "bad.csv"
    bad.write_text(
        AZURE.read_text().splitlines()[0] + "\n2023-11-16 18:15:46.6805900,374,44\nnot-a-time,1,2\n"
    )
    with bad.open("rb") as trace:
        response = api.post(
            "/api/v1/gates",
            {"trace": trace, "format": "azure", "spec": gate_file(model_dir)},
            format="multipart",
        )
    failed = imported(api, response)
    (error,) = failed["errors"]
    assert failed["status"] == "failed" and error["field"] == "trace" and "line 3" in error["message"]
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0
    # Another user's upload is not there for them.
    other = api_for(UserFactory(roles=["experimenter"]))
    assert other.get(f"/api/v1/gates/uploads/{failed['upload']}").status_code == 404


def test_no_live_host_is_a_503_and_nothing_is_saved(model_dir: Path) -> None:
    api = api_for(UserFactory(roles=["experimenter"]))
    response = post_gate(api, spec=gate_file(model_dir))
    assert response.status_code == 503 and "no host" in response.json()["detail"]
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0
    assert TraceUpload.objects.count() == 0


def test_a_host_gone_by_the_import_fails_the_upload_with_the_reason(model_dir: Path) -> None:
    from apps.runs.models import Host

    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    response = post_gate(api, spec=gate_file(model_dir))
    Host.objects.update(last_heartbeat=None)
    failed = imported(api, response)
    (error,) = failed["errors"]
    assert failed["status"] == "failed" and error["field"] == "host" and "no host" in error["message"]
    assert Experiment.objects.count() == 0 and Trace.objects.count() == 0


def issue(content: dict) -> Experiment:  # type: ignore[type-arg]
    """Store a hand-built manifest as an approval here would (the gate takes no other); its experiment."""
    from apps.approvals import manifest as mf
    from apps.approvals.models import Approval, RollbackManifest
    from tests.experiments.factories import make_experiment

    experiment = make_experiment(owner=UserFactory(roles=["experimenter"]), name="issued")
    approval = Approval.objects.create(
        experiment=experiment, approver=UserFactory(roles=["approver"]), verdict="approved", chosen_cell="C2",
        reason="the manifest the gate reads",
    )  # fmt: skip
    sha = mf.content_sha256(content)
    RollbackManifest.objects.create(
        experiment=experiment, approval=approval, content=content, sha256=sha, **mf.files(content, sha)
    )
    return experiment


def test_the_baseline_comes_from_an_approved_manifest_whose_digest_is_checked(model_dir: Path) -> None:
    from apps.approvals import manifest as mf

    make_host()
    content = mf.build_manifest(
        baseline={
            "cell_id": "B0",
            "image": "vllm/vllm-openai:v0.32.0",
            "model": {"path": str(model_dir), "revision": "r1"},
            "tokenizer_revision": "t1",
            "effective_args": {"args": {"max_num_batched_tokens": 2048, "max_num_seqs": 8}},
            "controls": {"dtype": "bfloat16", "max_model_len": 2048, "kv_cache_memory_bytes": 33554432},
            "deployment": {"revision": "prod-2026-11-01"},
            "abort_thresholds": {
                "short": {"ttft_p99_ms": 900, "e2e_p99_ms": 4000, "max_stall_ms": 800, "error_rate": 0.01}
            },
            "drain_deadline_s": 45,
        },
        candidate={
            "cell_id": "C2",
            "effective_args": {"args": {"max_num_batched_tokens": 1024, "max_num_seqs": 8}},
        },
        evidence={"experiment": {"id": 7}},
        approval={"approver": "release"},
    )
    doc = mf.document(content, mf.content_sha256(content))
    api = api_for(UserFactory(roles=["experimenter"]))
    refused = post_gate(api, baseline_manifest=mf.to_yaml(doc), classes="short:1024,long")
    assert "is not one this service issued" in refused.json()["errors"][0]["message"]
    approved = issue(content)
    created = start_gate(
        api,
        baseline_manifest=mf.to_yaml(doc),
        classes="short:1024,long",
        candidate_args=json.dumps({"max_num_seqs": 4}),
    )
    experiment = Experiment.objects.get(pk=created["gate"])
    cells = {c.cell_id: c for c in experiment.cells.all()}
    # Production as last approved: the approved overlay's args, not the rollback record's.
    assert cells["B0"].args == {"max_num_batched_tokens": 1024, "max_num_seqs": 8}
    assert cells["B0"].captured_from == "prod-2026-11-01"
    assert cells["C1"].args == {"max_num_batched_tokens": 1024, "max_num_seqs": 4}
    assert (
        experiment.engine_image == "vllm/vllm-openai:v0.32.0" and experiment.workload.drain_deadline_s == 45
    )
    short = experiment.classes.get(name="short")
    assert (short.ttft_p99_ms, short.error_rate) == (900, 0.01)
    # A class the manifest has no threshold for is judged on regression only.
    assert experiment.classes.get(name="long").ttft_p99_ms == 86_400_000

    tampered = dict(doc)
    tampered["baseline"] = {**doc["baseline"], "drain_deadline_s": 1}
    refused = post_gate(api, baseline_manifest=json.dumps(tampered), classes="short:1024,long")
    assert refused.status_code == 400
    assert refused.json()["errors"][0]["field"] == "baseline_manifest"
    both = post_gate(
        api, baseline_manifest=mf.to_json(doc), baseline_args='{"max_num_seqs": 1}', classes="a:9,b"
    )
    assert "baseline_args" in {e["field"] for e in both.json()["errors"]}
    assert Experiment.objects.exclude(pk=approved.pk).count() == 1


def test_the_remote_client_is_served_by_the_server(client) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/api/v1/gate-client.py")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert body == (Path(__file__).resolve().parents[2] / "clients" / "tailtune_gate.py").read_bytes()


def test_a_real_approved_manifest_is_b0_and_a_revoked_one_is_refused(analysed_experiment, approver) -> None:  # type: ignore[no-untyped-def]
    from apps.approvals.services import approval_revoke, experiment_approve

    make_host()
    manifest = experiment_approve(
        deployment_revision="rel-1",
        route_target="svc/llm",
        experiment=analysed_experiment,
        approver=approver,
        chosen_cell="B0",
        reason="production as it runs",
    )
    api = api_for(UserFactory(roles=["experimenter"]))
    text = bytes(manifest.yaml_bytes).decode()
    created = start_gate(
        api, baseline_manifest=text, classes="short:1024,long", candidate_args='{"max_num_seqs": 4}'
    )
    gate = Experiment.objects.get(pk=created["gate"])
    b0 = gate.cells.get(cell_id="B0")
    assert b0.args == {"max_num_batched_tokens": 2048, "max_num_seqs": 8}  # max_model_len is a control
    assert gate.max_model_len == analysed_experiment.max_model_len
    approval_revoke(experiment=analysed_experiment, actor=approver, reason="rolled back in production")
    refused = post_gate(api, baseline_manifest=text, classes="short:1024,long")
    assert refused.status_code == 400
    (error,) = refused.json()["errors"]
    assert error["field"] == "baseline_manifest" and "revoked" in error["message"]


def test_the_candidate_can_be_another_engine_build_or_model_revision(model_dir: Path) -> None:
    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    created = start_gate(
        api,
        spec=gate_file(model_dir),
        candidate_image="vllm/vllm-openai:v0.33.0",
        candidate_model_revision="rev-2",
    )
    experiment = Experiment.objects.get(pk=created["gate"])
    c1 = experiment.cells.get(cell_id="C1")
    assert c1.engine == {"image": "vllm/vllm-openai:v0.33.0", "model_revision": "rev-2"}
    assert c1.args == experiment.cells.get(cell_id="B0").args  # only the engine differs
    too_long = post_gate(api, spec=gate_file(model_dir), candidate_model_revision="r" * 300)
    assert too_long.status_code == 400 and too_long.json()["errors"][0]["field"] == "candidate_model_revision"


def test_a_class_quality_contract_in_the_gate_file_turns_the_probe_on(model_dir: Path) -> None:
    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    doc = yaml.safe_load(gate_file(model_dir))
    doc["classes"][0]["quality"] = {"min_exact_match": 1.0}
    gate = start_gate(
        api, spec=yaml.safe_dump(doc), candidate_args=json.dumps({"max_num_seqs": 2}), repeats="2"
    )
    experiment = Experiment.objects.get(pk=gate["gate"])
    short = next(c for c in experiment.spec["classes"] if c["name"] == "short")
    assert short["quality"] == {"min_exact_match": 1.0}
    assert experiment.spec["quality"]["probe"]["prompts_per_class"] == 8


@pytest.mark.parametrize(
    "candidate_args", [None, json.dumps({"scheduling_policy": "fcfs"})], ids=["nothing", "a-default"]
)
def test_an_unchanged_candidate_is_the_aa_control(model_dir: Path, candidate_args: str | None) -> None:
    # Nothing changed, or only a flag set to vLLM's own default: B0's effective config run again,
    # which the spec takes only as a control cell (docs/SPEC.md, "Cross-checks").
    make_host()
    api = api_for(UserFactory(roles=["experimenter"]))
    fields = {"candidate_args": candidate_args} if candidate_args else {}
    gate = start_gate(api, spec=gate_file(model_dir), **fields)
    c1 = Experiment.objects.get(pk=gate["gate"]).cells.get(cell_id="C1")
    assert c1.control is True
