"""No 500 from any hostile value: every URL pattern of the site and the API, walked from the
resolver, with hostile values in each path parameter and in every query parameter and form field
the views read, by GET and POST, as every role and with API tokens. Each answer is a refusal (4xx)
or a page (2xx/3xx); a 500 is a crash that a hostile value can cause at will."""

from __future__ import annotations

import inspect
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from apps.accounts.tokens import token_create
from apps.approvals.services import experiment_approve
from tests.experiments.factories import UserFactory, make_experiment
from tests.ui.factories import analysed

REPO = Path(__file__).resolve().parent.parent.parent

HOSTILE = [
    "²",  # a digit to str.isdigit(), not to int()
    "١٢",  # Arabic-Indic digits: isdigit() and int() both accept them, the database never saw them
    str(10**25),  # over the database's bigint
    "-1",
    "",
    "x" * 10_000,
    "\x00",
]

# Every query parameter and raw form field a view of ours reads (request.GET/POST/query_params).
# test_it_knows_every_parameter_the_views_read holds this list against the source.
PARAMS = [
    "a",
    "a_cell",
    "action",
    "actor",
    "b",
    "b_cell",
    "candidate",
    "capture",
    "capture_container",
    "capture_experiment",
    "capture_server",
    "capture_source",
    "capture_text",
    "cell",
    "deployment",
    "experiment",
    "format",
    "max_model_len",
    "mixture",
    "model_path",
    "owner",
    "page",
    "page_size",
    "q",
    "rate",
    "reason",
    "request_class",
    "route",
    "since",
    "status",
    "until",
]
_READS_QUERY = re.compile(r"\b(?:GET|query_params)\.get\(\s*[\"']([^\"']+)[\"']")
_READS_FORM = re.compile(r"\bPOST\.get\(\s*[\"']([^\"']+)[\"']")
# Names a module reads through a loop variable or a helper, which the scan cannot see.
_READ_INDIRECTLY = {
    # _filters; and the list's filters, read by apps/history/list_filters.py from the query.
    "apps.experiments.views": {
        "cell",
        "mixture",
        "rate",
        "status",
        "owner",
        "q",
        "route",
        "since",
        "until",
        "page",
    },
    "apps.api.views": {"status", "owner", "q", "route", "since", "until", "page"},
    "apps.history.views": {"a", "b", "a_cell", "b_cell", "route", "deployment"},  # comparison(), history()
    "apps.api.views_runs": {"page", "page_size"},  # _positive
}

# The admin's delete pages delete on any POST: posting to them would remove the walk's own users.
_NO_VALID_POST = re.compile(r"^admin/.+/delete/$")


def _walk(resolver: URLResolver, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry, prefix + str(entry.pattern))
        else:
            yield prefix + str(entry.pattern), entry


_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")
_GROUP = re.compile(r"\(\?P<(\w+)>[^)]*\)")


def _parameters(route: str) -> list[str]:
    return _CONVERTER.findall(route) + _GROUP.findall(route)


def _fill(route: str, values: dict[str, str]) -> str:
    """The URL for ``route`` with each parameter replaced by its (percent-encoded) value."""

    def one(match: re.Match[str]) -> str:
        return quote(values[match.group(1)], safe="")

    path = _GROUP.sub(one, _CONVERTER.sub(one, route)).replace("^", "").replace("$", "")
    return "/" + path


def _view_module(pattern: URLPattern) -> str:
    view = getattr(pattern.callback, "view_class", None) or inspect.unwrap(pattern.callback)
    return getattr(view, "__module__", "") or ""


def _reads(module_name: str) -> tuple[set[str], set[str]]:
    """The query parameters and the form fields a module of ours reads by name."""
    module = sys.modules.get(module_name)
    if not module_name.startswith(("apps.", "config.")) or module is None:
        return set(), set()
    source = inspect.getsource(module)
    query = set(_READS_QUERY.findall(source)) | _READ_INDIRECTLY.get(module_name, set())
    return query, set(_READS_FORM.findall(source))


class Walk:
    """One client's walk: each pattern, with each hostile value in turn

    1. in every parameter of PARAMS at once, on the valid URL, by GET (query) and POST (form);
    2. when that is refused as a bad or missing thing (400, 404), in each parameter the view
       reads on its own, so that the refusal of one does not hide what another would do;
    3. in each path parameter in turn, the others valid, by GET and POST;

    and, on the valid URL, the API's JSON body with every parameter, and a POST whose
    Content-Length is 5,000 digits.

    ``brief`` walks step 1 by GET only: for a pattern whose whole site refuses the client before
    any view code runs (the admin, for a user who is not staff: AdminSite.admin_view).
    """

    def __init__(self, who: str, client: Client, valid: dict[str, str], **extra: Any) -> None:
        self.who, self.client, self.valid, self.extra = who, client, valid, extra
        self.sent = 0
        self.crashes: list[str] = []

    def pattern(self, route: str, pattern: URLPattern, *, brief: bool = False) -> None:
        names = _parameters(route)
        good = _fill(route, {n: self.valid[n] for n in names})
        query, form = _reads(_view_module(pattern))
        for value in HOSTILE:
            everywhere = dict.fromkeys(PARAMS, value)
            refused = self.send("get", good, everywhere) in (400, 404)
            if brief:
                continue
            if not _NO_VALID_POST.match(route):
                refused |= self.send("post", good, everywhere) in (400, 404)
            if route.startswith("api/"):
                self.send("json", good, everywhere)  # the API's bodies are JSON
            if refused:
                for name in sorted(query):
                    self.send("get", good, {name: value})
                for name in sorted(form):
                    self.send("post", good, {name: value})
            for name in names:
                url = _fill(route, {**{n: self.valid[n] for n in names}, name: value})
                self.send("get", url, {})
                self.send("post", url, {})
        if not brief and not _NO_VALID_POST.match(route):
            # A Content-Length that no int() survives (Python refuses 4,300 digits and more).
            self.send("post", good, {}, CONTENT_LENGTH="9" * 5000)

    def send(self, method: str, url: str, data: dict[str, str], **headers: str) -> int:
        if method == "get":
            response = self.client.get(f"{url}?{urlencode(data)}" if data else url, **self.extra)
        elif method == "json":
            response = self.client.post(url, json.dumps(data), content_type="application/json", **self.extra)
        else:
            response = self.client.post(url, data, **self.extra, **headers)
        self.sent += 1
        if response.status_code >= 500:
            shown = _shown(method, url, data) + "".join(f" {k}={v[:12]!r}…" for k, v in headers.items())
            self.crashes.append(f"{self.who}: {shown} -> {response.status_code}")
        return response.status_code


def _shown(method: str, url: str, data: dict[str, str]) -> str:
    values = {repr(v[:12] + ("…" if len(v) > 12 else "")) for v in data.values()}
    what = ",".join(sorted(data)) if len(data) < len(PARAMS) else "every parameter"
    return f"{method.upper()} {url[:100]!r}" + (f" {what}={'/'.join(values)}" if data else "")


@pytest.fixture
def site(db, django_user_model):  # type: ignore[no-untyped-def]
    """Users in every role, an analysed experiment and an approved one with its manifest."""
    author = UserFactory(username="erin", roles=["experimenter"])
    users = {
        "viewer": UserFactory(username="vera", roles=["viewer"]),
        "experimenter": author,
        "approver": UserFactory(username="ada", roles=["approver"]),
        "admin": UserFactory(username="root", roles=["viewer", "experimenter"]),
    }
    django_user_model.objects.filter(pk=users["admin"].pk).update(is_staff=True, is_superuser=True)
    users["admin"].refresh_from_db()
    pending = analysed(make_experiment(owner=author, name="hostile-analysed"))
    approved = analysed(make_experiment(owner=author, name="hostile-approved"))
    experiment_approve(
        experiment=approved,
        approver=users["approver"],
        chosen_cell="B0",
        reason="keep the baseline",
        deployment_revision="rel-1",
        route_target="chat-pool",
    )
    from django.contrib.contenttypes.models import ContentType

    run = pending.runs.first()
    valid = {
        "pk": str(approved.pk),
        "object_id": str(pending.pk),
        "id": str(users["viewer"].pk),
        "content_type_id": str(ContentType.objects.get_for_model(type(pending)).pk),
        "run_id": str(run.run_id),
        "fmt": "json",
        "app_label": "experiments",
        "url": "nothing-here/",
    }
    return users, valid


@pytest.fixture
def quiet_refusals():  # type: ignore[no-untyped-def]
    # Thousands of refusals are logged one line each; a 500 (logged at ERROR) still shows.
    logger = logging.getLogger("django.request")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_it_knows_every_parameter_the_views_read() -> None:
    read: set[str] = set()
    for path in (REPO / "apps").rglob("*.py"):
        text = path.read_text()
        read |= set(_READS_QUERY.findall(text)) | set(_READS_FORM.findall(text))
    assert {"experiment", "page", "cell"} <= read, "the scan no longer finds what the views read"
    assert read | set().union(*_READ_INDIRECTLY.values()) <= set(PARAMS), sorted(read - set(PARAMS))


def test_it_walks_every_pattern_with_a_value_for_each_parameter() -> None:
    routes = {route: pattern for route, pattern in _walk(get_resolver())}
    assert len(routes) > 50 and "audit/" in routes and "api/v1/experiments/<int:pk>" in routes
    named = {"pk", "object_id", "id", "content_type_id", "run_id", "fmt", "app_label", "url"}
    assert {name for route in routes for name in _parameters(route)} <= named
    # The per-view scan sees the views' own reads: the audit page's filters, the records' paging.
    assert _reads(_view_module(routes["audit/"]))[0] == {"action", "actor", "experiment", "page"}
    assert "page_size" in _reads(_view_module(routes["api/v1/runs/<str:run_id>/records"]))[0]


@pytest.mark.django_db
def test_no_hostile_value_in_any_path_or_parameter_gets_a_500(site, quiet_refusals) -> None:  # type: ignore[no-untyped-def]
    users, valid = site
    patterns = list(_walk(get_resolver()))
    walks: list[Walk] = []

    anonymous = Walk("anonymous", Client(raise_request_exception=False), valid)
    for route, pattern in patterns:
        anonymous.pattern(route, pattern)
    walks.append(anonymous)
    for role, user in users.items():
        client = Client(raise_request_exception=False)
        client.force_login(user)
        walk = Walk(role, client, valid)
        for route, pattern in patterns:
            walk.pattern(route, pattern, brief=route.startswith("admin/") and not user.is_staff)
            if route == "accounts/logout/":
                client.force_login(user)  # the walk logged itself out: back in
        walks.append(walk)
    for role in ("viewer", "experimenter", "approver"):
        _, plaintext = token_create(user=users[role], name=f"hostile-{role}")
        bearer = Walk(
            f"{role}'s token",
            Client(raise_request_exception=False),
            valid,
            HTTP_AUTHORIZATION=f"Bearer {plaintext}",
        )
        for route, pattern in patterns:
            if route.startswith("api/"):
                bearer.pattern(route, pattern)
        walks.append(bearer)

    sent = sum(w.sent for w in walks)
    crashes = [line for w in walks for line in w.crashes]
    assert sent > 10_000, sent
    assert not crashes, f"{len(crashes)} of {sent} answers were 500:\n" + "\n".join(crashes[:80])


def test_an_id_is_ascii_digits_within_the_bigint() -> None:
    from config.params import MAX_ID, declared_length, parse_id

    assert parse_id("42") == 42 and parse_id(str(MAX_ID)) == MAX_ID
    for bad in (None, "", "0", "-1", "+1", " 1", "1 ", "²", "١٢", "1e3", "0x10", str(MAX_ID + 1), "9" * 5000):
        assert parse_id(bad) is None, bad
    assert declared_length("120") == 120 and declared_length("9" * 5000) == MAX_ID
    assert declared_length(None) == declared_length("١٢") == declared_length("-5") == 0


@pytest.mark.django_db
def test_a_nul_character_is_a_400_that_names_its_field(site) -> None:  # type: ignore[no-untyped-def]
    users, valid = site
    page = Client()
    page.force_login(users["experimenter"])
    audit = page.get("/audit/", {"actor": "a\x00b"})
    assert audit.status_code == 400 and b"actor: holds a NUL character" in audit.content
    goodput = page.post(f"/experiments/{valid['pk']}/goodput/", {"cell": "C1\x00"})
    assert goodput.status_code == 400 and b"cell: holds a NUL character" in goodput.content
    _, plaintext = token_create(user=users["viewer"], name="nul")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    records = api.get(f"/api/v1/runs/{valid['run_id']}/records", {"format": "\x00"})
    assert records.status_code == 400
    assert records.json() == {
        "errors": [{"field": "format", "message": "holds a NUL character, which no field takes"}]
    }
