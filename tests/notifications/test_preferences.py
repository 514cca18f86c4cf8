"""Each user chooses what they are told: the service, /notifications/ and /api/v1/me/notifications."""

from __future__ import annotations

import pytest

from apps.notifications.models import Notification, NotificationPreference
from apps.notifications.services import PreferenceError, preferences_get, preferences_set
from tests.api.test_api import client_for
from tests.experiments.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def hooks(settings):  # type: ignore[no-untyped-def]
    settings.TAILTUNE_WEBHOOKS = {"ops": "http://127.0.0.1:9/hook", "chat": "http://127.0.0.1:9/chat"}


def test_it_refuses_a_webhook_the_operator_did_not_configure_and_saves_nothing(viewer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PreferenceError) as err:
        preferences_set(
            user=viewer,
            choices={"analysed": {"email": False}, "gate_failed": {"webhooks": ["http://evil.example/"]}},
        )
    assert err.value.field == "gate_failed.webhooks" and "offered: chat, ops" in err.value.message
    assert not NotificationPreference.objects.exists()
    with pytest.raises(PreferenceError, match="analysed.email: must be true or false"):
        preferences_set(user=viewer, choices={"analysed": {"email": "yes"}})
    with pytest.raises(PreferenceError, match="not a kind"):
        preferences_set(user=viewer, choices={"everything": {}})


def test_the_api_reads_with_the_read_scope_and_changes_only_the_kinds_given(viewer) -> None:  # type: ignore[no-untyped-def]
    api = client_for(viewer)
    got = api.get("/api/v1/me/notifications").json()
    assert got["webhooks"] == ["chat", "ops"]
    assert got["preferences"]["gate_failed"] == {"email": True, "webhooks": []}
    put = api.put(
        "/api/v1/me/notifications",
        {"preferences": {"gate_failed": {"email": False, "webhooks": ["ops"]}}},
        format="json",
    )
    assert put.status_code == 200, put.content
    assert put.json()["preferences"]["gate_failed"] == {"email": False, "webhooks": ["ops"]}
    assert put.json()["preferences"]["analysed"] == {"email": True, "webhooks": []}
    bad = api.put(
        "/api/v1/me/notifications", {"preferences": {"analysed": {"webhooks": ["x"]}}}, format="json"
    )
    assert bad.status_code == 400
    assert bad.json()["errors"][0]["field"] == "preferences.analysed.webhooks"


def test_the_page_saves_the_choices_and_lists_what_was_sent(client, viewer) -> None:  # type: ignore[no-untyped-def]
    other = UserFactory(username="olga", roles=["viewer"])
    Notification.objects.create(user=viewer, kind="analysed", channel="email", target="v@x", subject="mine")
    Notification.objects.create(
        user=other, kind="analysed", channel="email", target="o@x", subject="not mine"
    )
    client.force_login(viewer)
    page = client.get("/notifications/").content.decode()
    assert "mine" in page and "not mine" not in page and "webhook ops" in page
    client.post("/notifications/save", {"analysed-webhooks": ["chat"], "gate_failed-email": "on"})
    prefs = preferences_get(user=viewer)
    assert prefs["analysed"] == {"email": False, "webhooks": ["chat"]}
    assert prefs["gate_failed"] == {"email": True, "webhooks": []}
