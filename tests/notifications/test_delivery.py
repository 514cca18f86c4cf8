"""Notifications made from audit events and delivered: Django's locmem mail backend and a real
webhook receiver in a thread (tests/notifications/webhook_receiver.py). The ``tailtune.notify``
task runs eagerly (``apply``): its retries run at once, in this process."""

from __future__ import annotations

import pytest
from django.core import mail

from apps.analysis.models import Decision
from apps.audit.services import audit_record
from apps.notifications.models import Notification
from apps.notifications.services import MAX_ATTEMPTS, preferences_set
from apps.runs import dispatch
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import UserFactory, make_experiment
from tests.notifications.webhook_receiver import webhook_receiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def locmem(settings):  # type: ignore[no-untyped-def]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def analysed(experiment, *, chosen: str = "", recovery: str = "pass", capture):  # type: ignore[no-untyped-def]
    """The experiment's decision and its ``experiment.analysed`` row; the tasks sent, held."""
    Decision.objects.create(
        experiment=experiment,
        outcome="retune" if chosen else "retain",
        chosen_cell=chosen,
        rule="test",
        checks={"recovery": {"status": recovery}},
    )
    with capture(execute=True):
        audit_record(action="experiment.analysed", experiment=experiment)


def deliver_all(held) -> list:  # type: ignore[no-untyped-def]
    from workers.tasks import notify

    assert {name for name, _, _ in held} <= {dispatch.NOTIFY}
    return [notify.apply(kwargs=kwargs) for _, kwargs, _ in held]


def test_it_emails_the_author_and_the_approvers_and_no_one_else(
    monkeypatch, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    held = hold_tasks(monkeypatch, dispatch.NOTIFY)
    author = UserFactory(username="erin", email="erin@example.org", roles=["experimenter", "approver"])
    UserFactory(username="ada", email="ada@example.org", roles=["approver"])
    UserFactory(username="vera", email="vera@example.org", roles=["viewer"])
    experiment = make_experiment(owner=author, name="batching")
    analysed(experiment, chosen="C1", capture=django_capture_on_commit_callbacks)

    deliver_all(held)
    sent = {(m.to[0], m.subject) for m in mail.outbox}
    assert sent == {
        ("erin@example.org", f"[tailtune] batching (#{experiment.pk}) is analysed: retune"),
        # The author is an approver too, but is not asked to approve their own experiment.
        ("ada@example.org", f"[tailtune] batching (#{experiment.pk}) proposes C1 and waits for an approver"),
    }
    assert f"/experiments/{experiment.pk}/" in mail.outbox[0].body
    rows = Notification.objects.all()
    assert {(r.user.username, r.kind, r.status, r.attempts) for r in rows} == {
        ("erin", "analysed", "sent", 1),
        ("ada", "approval_waiting", "sent", 1),
    }
    assert all(r.sent_at is not None and r.attempt_log[0]["ok"] for r in rows)


def test_a_user_who_turned_a_kind_off_is_not_told(monkeypatch, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    held = hold_tasks(monkeypatch, dispatch.NOTIFY)
    author = UserFactory(username="erin", email="erin@example.org", roles=["experimenter"])
    preferences_set(user=author, choices={"analysed": {"email": False}})
    analysed(make_experiment(owner=author), capture=django_capture_on_commit_callbacks)
    assert held == [] and not Notification.objects.exists() and mail.outbox == []


def test_a_webhook_that_fails_twice_is_retried_and_every_attempt_recorded(
    monkeypatch, settings, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    held = hold_tasks(monkeypatch, dispatch.NOTIFY)
    author = UserFactory(username="erin", roles=["experimenter"])  # no address: webhook only
    with webhook_receiver(fail_first=2) as hook:
        settings.TAILTUNE_WEBHOOKS = {"ops": hook.url}
        preferences_set(user=author, choices={"rehearsal_failed": {"email": True, "webhooks": ["ops"]}})
        experiment = make_experiment(owner=author, name="rehearsed")
        analysed(experiment, chosen="C1", recovery="fail", capture=django_capture_on_commit_callbacks)
        assert len(held) == 1  # the rehearsal's webhook; no email (no address), no approver
        deliver_all(held)
    assert hook.answers == [503, 503, 204]
    assert hook.received[0]["kind"] == "rehearsal_failed"
    assert hook.received[0]["experiment"]["id"] == experiment.pk
    row = Notification.objects.get()
    assert (row.channel, row.target, row.status, row.attempts) == ("webhook", "ops", "sent", 3)
    assert [a["status_code"] for a in row.attempt_log] == [503, 503, 204]
    assert [a["ok"] for a in row.attempt_log] == [False, False, True]
    assert "503" in row.last_error and row.payload == hook.received[0]


def test_a_webhook_that_never_accepts_is_given_up_after_the_last_attempt(
    monkeypatch, settings, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    held = hold_tasks(monkeypatch, dispatch.NOTIFY)
    author = UserFactory(username="erin", roles=["experimenter"])
    with webhook_receiver(fail_first=99) as hook:
        settings.TAILTUNE_WEBHOOKS = {"ops": hook.url}
        preferences_set(user=author, choices={"analysed": {"email": False, "webhooks": ["ops"]}})
        analysed(make_experiment(owner=author), capture=django_capture_on_commit_callbacks)
        deliver_all(held)
    assert len(hook.answers) == MAX_ATTEMPTS
    row = Notification.objects.get()
    assert (row.status, row.attempts, row.sent_at) == ("failed", MAX_ATTEMPTS, None)


def test_a_redelivered_task_sends_nothing_twice(monkeypatch, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    held = hold_tasks(monkeypatch, dispatch.NOTIFY)
    author = UserFactory(username="erin", email="erin@example.org", roles=["experimenter"])
    analysed(make_experiment(owner=author), capture=django_capture_on_commit_callbacks)
    deliver_all(held)
    deliver_all(held)
    assert len(mail.outbox) == 1 and Notification.objects.get().attempts == 1


def test_a_gate_that_did_not_pass_tells_its_author_and_the_approvers(
    monkeypatch, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    held = hold_tasks(monkeypatch, dispatch.NOTIFY)
    ci = UserFactory(username="ci", email="ci@example.org", roles=["experimenter"])
    UserFactory(username="ada", email="ada@example.org", roles=["approver"])
    gate = make_experiment(owner=ci, name="gate")
    with django_capture_on_commit_callbacks(execute=True):
        audit_record(action="gate.verdict", experiment=gate, detail={"verdict": "pass"})
        audit_record(action="gate.verdict", experiment=gate, detail={"verdict": "regression"})
    deliver_all(held)
    assert sorted(m.to[0] for m in mail.outbox) == ["ada@example.org", "ci@example.org"]
    assert all(m.subject == f"[tailtune] gate gate (#{gate.pk}): regression" for m in mail.outbox)
