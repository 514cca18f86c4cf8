"""The revisions a model directory records, offered as the create page's defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.workloads.services import model_revisions


def test_the_tiny_models_revision_file_and_a_hub_cache_layout(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "tailtune-revision.json").write_text(
        json.dumps({"model_revision": "m7", "tokenizer_revision": "t7"})
    )
    assert model_revisions(str(tiny)) == {"model_revision": "m7", "tokenizer_revision": "t7"}
    repo = tmp_path / "models--org--llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0e9e39f249a16976918f6564b8830bc894c89659\n")
    snapshot = repo / "snapshots" / "0e9e39f249a16976918f6564b8830bc894c89659"
    snapshot.mkdir(parents=True)
    expected = {"model_revision": "0e9e39f249a16976918f6564b8830bc894c89659"} | {
        "tokenizer_revision": "0e9e39f249a16976918f6564b8830bc894c89659"
    }
    assert model_revisions(str(repo)) == expected == model_revisions(str(snapshot))
    assert model_revisions(str(tmp_path)) == {} and model_revisions("") == {}


@pytest.mark.django_db
def test_the_create_page_offers_the_models_recorded_revisions(client, author, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = tmp_path / "m"
    model.mkdir()
    (model / "tailtune-revision.json").write_text(
        json.dumps({"model_revision": "m7", "tokenizer_revision": "t7"})
    )
    client.force_login(author)
    page = client.get("/experiments/new/", {"model_path": str(model)}).content.decode()
    assert 'value="m7"' in page and 'value="t7"' in page and f'value="{model}"' in page
    assert (
        'value="m7"'
        not in client.get("/experiments/new/", {"model_path": str(tmp_path / "nope")}).content.decode()
    )
