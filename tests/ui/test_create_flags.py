"""B0's other vLLM flags on the create page (#34 item 2): typed as YAML, kept by every candidate, and a
denied one shown beside the field with why, nothing saved."""

from __future__ import annotations

import pytest

from apps.experiments.models import Experiment
from tests.ui.forms_data import form_data

# Priority 0 for both classes: the cells schedule fcfs.
FCFS = {"classes-1-priority": "0"}


@pytest.mark.django_db
def test_b0s_other_flags_are_created_with_b0_and_kept_by_every_candidate(client, author) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post(
        "/experiments/new/",
        form_data(create="1", baseline_more_args="{kv_cache_dtype: fp8, block_size: 16}", **FCFS),
    )
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    experiment = Experiment.objects.get()
    cells = {c.cell_id: c.args for c in experiment.cells.all()}
    assert cells["B0"] == {
        "kv_cache_dtype": "fp8",
        "block_size": 16,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 8,
    }
    assert all(args["kv_cache_dtype"] == "fp8" and args["block_size"] == 16 for args in cells.values())


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("typed", "fragment"),
    [
        ("{trust_remote_code: true}", "baseline.args.trust_remote_code: is denied: it runs Python code"),
        ("{swap_space: 16}", "baseline.args.swap_space: is not a flag of vLLM 0.32.0's server"),
        ("{max_model_len: 1024}", "baseline.args.max_model_len: is a frozen control"),
        ("[kv_cache_dtype]", "must be a mapping of flags"),
    ],
)
def test_a_flag_it_refuses_is_shown_beside_the_field(client, author, typed, fragment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(author)
    response = client.post("/experiments/new/", form_data(create="1", baseline_more_args=typed, **FCFS))
    assert response.status_code == 400
    errors = [str(e) for e in response.context["form"].errors.get("baseline_more_args", [])]
    assert any(fragment in e for e in errors), response.context["form"].errors
    assert Experiment.objects.count() == 0
