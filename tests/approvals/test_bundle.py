"""The review bundle (apps/approvals/bundle.py): one self-contained HTML file, audited with its sha256."""

from __future__ import annotations

import gzip
import hashlib
import json
import re

import pytest
from rest_framework.test import APIClient

from apps.accounts.tokens import token_create
from apps.audit.models import AuditEvent
from apps.workloads.models import Trace

pytestmark = pytest.mark.django_db

SECRET_KEY_TEXT = "sk-abcdefghijklmnopqrstuvwxyz0123456789"
HIDDEN_PROMPT = "the eleventh prompt must never leave the trace store"


def store_trace(experiment) -> Trace:  # type: ignore[no-untyped-def]
    """A stored trace for the experiment's first sweep run: a secret in the first prompt, and a
    prompt past the sample that must not appear."""
    run = experiment.runs.filter(kind="sweep").first()
    lines = [json.dumps({"format": "tailtune-trace", "version": 1})]
    for i in range(12):
        prompt = f"mail ops@example.com key {SECRET_KEY_TEXT} " + "x" * 200 if i == 0 else f"prompt {i}"
        if i == 11:
            prompt = HIDDEN_PROMPT
        lines.append(
            json.dumps(
                {
                    "index": i,
                    "t_offset_s": i * 0.5,
                    "class": "short",
                    "input_tokens": 64,
                    "output_tokens": 8,
                    "priority": 0,
                    "warmup": i == 0 and False,
                    "prompt": prompt,
                    "prompt_token_ids": [777777, 888888],
                }
            )  # fmt: skip
        )
    return Trace.objects.create(
        sha256=run.trace_sha256,
        corpus_sha256=run.corpus_sha256,
        label="80-20 @ low",
        requests=12,
        duration_s=5.5,
        stats={"requests": 12, "rate_rps": 2.18, "input_tokens": {"p50": 64, "p99": 64}},
        content_gz=gzip.compress(("\n".join(lines) + "\n").encode()),
    )


def test_the_page_link_downloads_one_self_contained_audited_file(client, viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    store_trace(analysed_experiment)
    client.force_login(viewer)
    page = client.get(f"/experiments/{analysed_experiment.pk}/results/").content.decode()
    assert f'href="/experiments/{analysed_experiment.pk}/review-bundle.html"' in page

    response = client.get(f"/experiments/{analysed_experiment.pk}/review-bundle.html")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert "attachment" in response["Content-Disposition"]
    body = response.content
    sha = hashlib.sha256(body).hexdigest()
    assert response["X-Bundle-Sha256"] == sha
    event = AuditEvent.objects.get(action="review_bundle.downloaded")
    assert event.detail["sha256"] == sha and event.actor == viewer and event.experiment == analysed_experiment

    html = body.decode()
    decision = analysed_experiment.decision
    for part in (
        'id="decision"',
        'id="contracts"',
        'id="checks"',
        'id="manifest"',
        'id="runs"',
        'id="traces"',
    ):
        assert part in html
    assert decision.outcome in html and "2000.0" in html  # the short class's TTFT p99 limit
    # Self-contained: no script, nothing fetched; the charts are data: URIs.
    assert "<script" not in html
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert len(re.findall(r'<img src="data:image/svg\+xml;base64,', html)) == 2
    assert html.count("<tr><td>", html.index('id="runs"')) >= analysed_experiment.runs.count()
    # The trace: its statistics and a redacted sample; no secret, no token ids, nothing past the sample.
    assert "rate rps" in html and "ops@example.com" not in html and SECRET_KEY_TEXT not in html
    assert "[KEY]" in html and "[EMAIL]" in html
    assert HIDDEN_PROMPT not in html and "777777" not in html
    assert "x" * 100 not in html  # the long prompt is cut short


def test_the_api_serves_the_bundle_with_its_digest_to_a_read_token(viewer, analysed_experiment) -> None:  # type: ignore[no-untyped-def]
    _, plaintext = token_create(user=viewer, name="ticket-bot")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    response = api.get(f"/api/v1/experiments/{analysed_experiment.pk}/bundle")
    assert response.status_code == 200
    assert response["X-Bundle-Sha256"] == hashlib.sha256(response.content).hexdigest()
    assert plaintext.encode() not in response.content  # the token never lands in the file
    event = AuditEvent.objects.get(action="review_bundle.downloaded")
    assert event.detail["api_token"] == "ticket-bot"


def test_no_bundle_before_the_analysis(client, viewer, experiment) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)
    assert client.get(f"/experiments/{experiment.pk}/review-bundle.html").status_code == 404
    assert not AuditEvent.objects.filter(action="review_bundle.downloaded").exists()
