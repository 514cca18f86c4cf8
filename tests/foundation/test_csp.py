"""The Content-Security-Policy: on every answer, strict for scripts, and nothing of ours needs what it
blocks (an inline script, an on* handler, a javascript: URL, eval). The browser tests run with the
policy on and fail on any violation the browser reports (tests/browser/conftest.py)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.test import Client

from apps.accounts.tokens import token_create
from tests.experiments.factories import UserFactory, make_experiment
from tests.ui.factories import analysed

REPO = Path(__file__).resolve().parent.parent.parent
TEMPLATE_DIRS = [REPO / "templates", *sorted((REPO / "apps").glob("*/templates"))]
# A data block (json_script) is not run, so the policy does not apply to it.
DATA_TYPES = {"application/json", "application/ld+json"}


def _policy(response) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    header = response.headers.get("Content-Security-Policy", "")
    assert header, f"no Content-Security-Policy on {response.request['PATH_INFO']}"
    directives = {}
    for part in header.split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives


class _Blocked(HTMLParser):
    """What a page holds that `script-src 'self'` would block."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._inline_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>: an inline event handler")
            if name in ("href", "src", "action", "formaction") and (value or "").strip().lower().startswith(
                "javascript:"
            ):
                self.found.append(f"<{tag} {name}={value!r}>: a javascript: URL")
        if tag == "script":
            src = named.get("src")
            kind = (named.get("type") or "").lower()
            self._inline_script = not src and kind not in DATA_TYPES
            if src and not src.startswith("/"):
                self.found.append(f"<script src={src!r}>: not from this origin")

    def handle_data(self, data: str) -> None:
        if self._inline_script and data.strip():
            self.found.append(f"an inline script: {data.strip()[:60]!r}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._inline_script = False


def _blocked(html: str) -> list[str]:
    parser = _Blocked()
    parser.feed(html)
    return parser.found


@pytest.fixture
def pages(db, django_user_model):  # type: ignore[no-untyped-def]
    """Every kind of page, rendered for a user who may see it: (client, path) pairs."""
    author = UserFactory(username="erin", roles=["experimenter"])
    approver = UserFactory(username="ada", roles=["approver"])
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")
    experiment = analysed(make_experiment(owner=author, name="csp-analysed"))
    planned = make_experiment(owner=author, name="csp-planned")
    run = experiment.runs.first()
    token_create(user=author, name="csp")
    as_author, as_approver, as_root, anonymous = Client(), Client(), Client(), Client()
    as_author.force_login(author)
    as_approver.force_login(approver)
    as_root.force_login(root)
    return [
        (anonymous, "/accounts/login/"),
        (anonymous, "/api/v1/docs/"),
        (as_author, "/"),
        (as_author, "/experiments/new/"),
        (as_author, f"/experiments/{experiment.pk}/"),
        (as_author, f"/experiments/{planned.pk}/"),
        (as_author, f"/experiments/{experiment.pk}/results/"),
        (as_author, f"/runs/{run.run_id}/"),
        (as_author, "/accounts/tokens/"),
        (as_author, "/audit/"),
        (as_approver, f"/experiments/{experiment.pk}/approve/"),
        (as_root, "/admin/"),
        (as_root, f"/admin/experiments/experiment/{experiment.pk}/change/"),
        (as_root, "/admin/auth/user/add/"),
    ]


def test_every_page_carries_a_strict_policy(pages) -> None:  # type: ignore[no-untyped-def]
    for client, path in pages:
        response = client.get(path)
        assert response.status_code == 200, path
        policy = _policy(response)
        assert policy["default-src"] == ["'self'"], path
        assert policy["script-src"] == ["'self'"], path  # no 'unsafe-inline', no 'unsafe-eval'
        assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
        assert policy["base-uri"] == ["'none'"] and policy["form-action"] == ["'self'"]
    # An API answer and a refusal carry it too.
    assert _policy(Client().get("/api/v1/experiments"))["script-src"] == ["'self'"]
    assert _policy(Client().get("/healthz"))["default-src"] == ["'self'"]


def test_no_page_holds_what_the_policy_blocks(pages) -> None:  # type: ignore[no-untyped-def]
    found = []
    for client, path in pages:
        html = client.get(path).content.decode()
        found += [f"{path}: {what}" for what in _blocked(html)]
    assert not found, "\n".join(found)


def test_the_parser_finds_what_the_policy_blocks() -> None:
    assert _blocked('<select onchange="this.form.submit()"></select>')
    assert _blocked("<script>alert(1)</script>")
    assert _blocked('<a href="javascript:go()">x</a>')
    assert _blocked('<script src="https://cdn.example/x.js"></script>')
    assert not _blocked(
        '<script src="/static/x.js" defer></script><script type="application/json">{}</script>'
    )


def test_no_template_or_script_of_ours_needs_what_the_policy_blocks() -> None:
    templates = [p for d in TEMPLATE_DIRS for p in d.rglob("*.html")]
    assert len(templates) > 10
    found = []
    for path in templates:
        text = path.read_text()
        # The template source, tags and all: a handler or an inline script in any branch of it.
        found += [
            f"{path.relative_to(REPO)}: {what}" for what in _blocked(re.sub(r"{%.*?%}|{{.*?}}", "", text))
        ]
    scripts = sorted((REPO / "static").rglob("*.js"))
    assert scripts
    code_from_text = re.compile(r"\beval\s*\(|\bnew\s+Function\s*\(|\bset(?:Timeout|Interval)\s*\(\s*[\"'`]")
    for path in scripts:
        for match in code_from_text.finditer(path.read_text()):
            found.append(f"{path.relative_to(REPO)}: {match.group(0)!r} runs text as code")
    assert not found, "\n".join(found)
