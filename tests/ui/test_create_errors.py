"""One test per validation error: each is shown beside the field that caused it, and nothing is saved."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.experiments.models import Experiment
from tests.ui.forms_data import form_data

# (what the user typed, where the error must appear, a fragment of its message).
# Where: a form field name, ("classes"|"cells", row, field), or ("classes", None) for the formset.
CASES = [
    ({"name": ""}, "name", "is required"),
    ({"model_path": ""}, "model_path", "is required"),
    ({"model_path": ".engine/models/../../var"}, "model_path", "must not contain '..'"),
    ({"model_path": "/etc"}, "model_path", "must be a model directory under the host's model roots"),
    ({"model_revision": ""}, "model_revision", "is required"),
    ({"tokenizer_revision": ""}, "tokenizer_revision", "is required"),
    ({"max_model_len": ""}, "max_model_len", "is required"),
    ({"max_model_len": "0"}, "max_model_len", "must be positive"),
    ({"tensor_parallel_size": "0"}, "tensor_parallel_size", "must be positive"),
    ({"gpu_memory_utilization": "1.5"}, "gpu_memory_utilization", "at most 1.0"),
    ({"kv_cache_memory_bytes": "-1"}, "kv_cache_memory_bytes", "must be positive"),
    ({"generation": "{temperature: [0"}, "generation", "not valid YAML"),
    ({"generation": "- 1\n- 2"}, "generation", "must be a mapping"),
    ({"baseline_id": ""}, "baseline_id", "is required"),
    ({"baseline_max_num_batched_tokens": "0"}, "baseline_max_num_batched_tokens", "must be positive"),
    ({"baseline_max_num_seqs": "-4"}, "baseline_max_num_seqs", "must be positive"),
    (
        {"baseline_enable_chunked_prefill": "false", "baseline_max_num_batched_tokens": "1024"},
        "baseline_max_num_batched_tokens",
        "vLLM refuses",
    ),
    ({"grid_max_num_batched_tokens": "512, lots"}, "grid_max_num_batched_tokens", "not a whole number"),
    ({"grid_max_num_batched_tokens": "512, 512"}, "grid_max_num_batched_tokens", "listed twice"),
    ({"grid_max_num_seqs": "0"}, "grid_max_num_seqs", "must be positive"),
    (
        {"grid_enable_chunked_prefill": "false"},
        "grid_max_num_batched_tokens",
        "vLLM refuses",
    ),
    (
        {"grid_max_num_batched_tokens": "", "grid_max_num_seqs": ""},
        "grid_max_num_batched_tokens",
        "non-empty list",
    ),
    ({"cells-0-cell_id": "B0", "cells-0-max_num_seqs": "4"}, ("cells", 0, "cell_id"), "duplicate cell id"),
    ({"cells-1-cell_id": "X", "cells-1-max_num_seqs": "0"}, ("cells", 1, "max_num_seqs"), "must be positive"),
    ({"classes-0-name": ""}, ("classes", 0, "name"), "is required"),
    ({"classes-1-name": "short"}, ("classes", 1, "name"), "duplicate class name"),
    ({"classes-1-input_tokens": "2047"}, ("classes", 1, "input_tokens"), "exceed controls.max_model_len"),
    ({"classes-0-output_tokens": "0"}, ("classes", 0, "output_tokens"), "must be positive"),
    ({"classes-0-shared_prefix_tokens": "100"}, ("classes", 0, "shared_prefix_tokens"), "must not exceed"),
    ({"classes-0-ttft_p99_ms": ""}, ("classes", 0, "ttft_p99_ms"), "is required"),
    ({"classes-1-max_stall_ms": "-5"}, ("classes", 1, "max_stall_ms"), "must be positive"),
    ({"classes-0-error_rate": "1.5"}, ("classes", 0, "error_rate"), "at most 1.0"),
    (
        {
            f"classes-{r}-{k}": ""
            for r in (0, 1)
            for k in (
                "name",
                "input_tokens",
                "output_tokens",
                "priority",
                "shared_prefix_tokens",
                "ttft_p99_ms",
                "e2e_p99_ms",
                "max_stall_ms",
                "error_rate",
            )
        },
        ("classes", None),
        "non-empty list",
    ),
    ({"mixtures": "80-20: short=0.8, long=0.3"}, "mixtures", "must sum to 1"),
    ({"mixtures": "80-20: short=0.8, medium=0.2"}, "mixtures", "unknown class 'medium'"),
    ({"mixtures": "just words"}, "mixtures", "line 1"),
    ({"mixtures": "m: short=lots"}, "mixtures", "is not a number"),
    ({"mixtures": "m: short=1.0\nm: long=1.0"}, "mixtures", "named twice"),
    ({"mixtures": ""}, "mixtures", "at least one mixture"),
    ({"rates": ""}, "rates", "at least one rate"),
    ({"rates": "low: fast"}, "rates", "not a number"),
    ({"rates": "low: -1"}, "rates", "must be positive"),
    ({"rates": "low: 1\nlow: 2"}, "rates", "named twice"),
    ({"arrival_process": "gamma"}, "arrival_cv", "is required"),
    ({"arrival_cv": "2.0"}, "arrival_cv", "only applies to the gamma process"),
    ({"arrival_process": "gamma", "arrival_cv": "0"}, "arrival_cv", "must be positive"),
    ({"repeats": ""}, "repeats", "is required"),
    ({"repeats": "0"}, "repeats", "must be positive"),
    ({"seed": ""}, "seed", "is required"),
    ({"warmup_s": "-1"}, "warmup_s", "at least 0.0"),
    ({"observation_s": "0"}, "observation_s", "must be positive"),
    ({"drain_deadline_s": "0"}, "drain_deadline_s", "must be positive"),
    ({"max_dispatch_lag_ms": "0"}, "max_dispatch_lag_ms", "must be positive"),
    ({"repeats": "two"}, "repeats", "whole number"),
]


def _errors_at(response, where) -> list[str]:  # type: ignore[no-untyped-def]
    ctx = response.context
    if isinstance(where, str):
        return [str(e) for e in ctx["form"].errors.get(where, [])]
    formset = ctx[where[0]]
    if where[1] is None:
        return [str(e) for e in formset.non_form_errors()]
    return [str(e) for e in formset.forms[where[1]].errors.get(where[2], [])]


@pytest.mark.django_db
@pytest.mark.parametrize(("overrides", "where", "fragment"), CASES, ids=[str(c[0])[:60] for c in CASES])
def test_it_shows_each_validation_error_beside_its_field(client, author, overrides, where, fragment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post("/experiments/new/", form_data(create="1", **overrides))
    assert response.status_code == 400
    errors = _errors_at(response, where)
    assert any(fragment in e for e in errors), (where, errors, response.context["form"].errors)
    assert Experiment.objects.count() == 0


@pytest.mark.django_db
def test_it_renders_the_error_text_next_to_the_field_in_the_page(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post("/experiments/new/", form_data(rates="low: -1"))
    html = response.content.decode()
    field = html.index('id="field-rates"')
    error = html.index("must be positive", field)
    next_field = html.index('id="field-arrival_process"')
    assert field < error < next_field


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"name: [unclosed", "not valid YAML"),
        (b"name: x\nbogus: 1\n", "bogus: unknown field"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"- just\n- a list\n", "must be a mapping"),
    ],
)
def test_it_shows_upload_errors_beside_the_upload_field(client, author, content, fragment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    upload = SimpleUploadedFile("spec.yaml", content, content_type="text/yaml")
    response = client.post("/experiments/new/", form_data(spec_file=upload, create="1"))
    assert response.status_code == 400
    errors = [str(e) for e in response.context["form"].errors["spec_file"]]
    assert any(fragment in e for e in errors), errors
    assert Experiment.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("{bogus_section: 1}", "bogus_section: unknown field"),
        ("[1, 2]", "must be a mapping"),
        ("{workload: {}}", "set these with the fields above"),
        ("{a: [", "not valid YAML"),
    ],
)
def test_it_shows_errors_of_the_extra_sections_beside_that_field(client, author, extra, fragment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post("/experiments/new/", form_data(extra=extra, create="1"))
    assert response.status_code == 400
    errors = [str(e) for e in response.context["form"].errors["extra"]]
    assert any(fragment in e for e in errors), errors
    assert Experiment.objects.count() == 0


@pytest.fixture
def model_roots(settings, tmp_path):  # type: ignore[no-untyped-def]
    """A model root, and beside it a directory that looks like a model (with recorded revisions)."""
    import json

    root = tmp_path / "models"
    root.mkdir()
    outside = tmp_path / "private" / "model"
    outside.mkdir(parents=True)
    (outside / "tailtune-revision.json").write_text(
        json.dumps({"model_revision": "secret-rev", "tokenizer_revision": "secret-tok"})
    )
    settings.TAILTUNE_MODEL_ROOTS = [str(root)]
    return root, outside


def _normalised(page: str, path: str) -> str:
    """The page with the typed path (and the CSRF token, new on every page) taken out."""
    import re

    page = page.replace(path, "<typed>")
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", page)


@pytest.mark.django_db
def test_a_model_path_outside_the_roots_shows_the_same_page_exists_or_not(client, author, model_roots):  # type: ignore[no-untyped-def]
    """Posted, the error is identical; asked for as the form's default (?model_path=), the page
    neither fills in the directory's recorded revisions nor differs from a path that is not there."""
    _, outside = model_roots
    client.force_login(author)
    missing = outside.parent / "no-such-model"
    posted = [
        client.post("/experiments/new/", form_data(create="1", model_path=str(p))) for p in (outside, missing)
    ]
    assert [r.status_code for r in posted] == [400, 400]
    errors = [_errors_at(r, "model_path") for r in posted]
    assert errors[0] == errors[1] and "model roots" in errors[0][0]
    assert _normalised(posted[0].content.decode(), str(outside)) == _normalised(
        posted[1].content.decode(), str(missing)
    )
    assert Experiment.objects.count() == 0

    asked = [
        client.get("/experiments/new/", {"model_path": str(p)}).content.decode() for p in (outside, missing)
    ]
    assert "secret-rev" not in asked[0] and str(outside) not in asked[0]
    assert _normalised(asked[0], str(outside)) == _normalised(asked[1], str(missing))
