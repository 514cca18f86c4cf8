"""Notifications: made from audit events (``notify_audit_event``), delivered one attempt at a
time (``notification_deliver``, the body of the ``tailtune.notify`` task), and chosen by each
user (``preferences_get`` / ``preferences_set``).

1. An audit row is written (apps/audit): the receiver (receivers.py) hands it here.
2. events.wanted says which kinds it calls for and for whom (the author, the approvers).
3. Each such user's preference for the kind says the channels: email (to the user's address),
   and the operator's webhooks the user picked by name. One Notification row per channel.
4. Each row is sent by the ``tailtune.notify`` task once the transaction commits; the task makes
   one attempt per run, records it on the row, and is retried with a growing delay
   (workers/tasks.py) until MAX_ATTEMPTS.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from apps.accounts.roles import APPROVER
from apps.audit.models import AuditEvent
from apps.notifications import events
from apps.notifications.models import Notification, NotificationPreference
from apps.runs import dispatch

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4
DEFAULT_EMAIL = True  # a user with no preference row for a kind is emailed
WEBHOOK_TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class DeliveryFailed(Exception):
    """This attempt failed and another is due: the task retries on it."""


class PreferenceError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def webhook_names() -> list[str]:
    return sorted(getattr(settings, "TAILTUNE_WEBHOOKS", {}) or {})


# -- preferences ---------------------------------------------------------------------------


def preferences_get(*, user: Any) -> dict[str, dict[str, Any]]:
    """Every kind with the user's choice (the default where none was made)."""
    rows = {p.kind: p for p in NotificationPreference.objects.filter(user=user)}
    out: dict[str, dict[str, Any]] = {}
    for kind in events.KINDS:
        row = rows.get(kind)
        out[kind] = {
            "email": row.email if row else DEFAULT_EMAIL,
            "webhooks": list(row.webhooks) if row else [],
        }
    return out


def _clean(choices: Any) -> dict[str, tuple[bool, list[str]]]:
    if not isinstance(choices, Mapping):
        raise PreferenceError("preferences", f"must be an object of kinds ({', '.join(events.KINDS)})")
    known = set(webhook_names())
    out: dict[str, tuple[bool, list[str]]] = {}
    for kind, choice in choices.items():
        if kind not in events.KINDS:
            raise PreferenceError(
                str(kind)[:64], f"is not a kind of notification ({', '.join(events.KINDS)})"
            )
        if not isinstance(choice, Mapping):
            raise PreferenceError(kind, "must be an object with email (true/false) and webhooks (names)")
        extra = sorted(set(choice) - {"email", "webhooks"})
        if extra:
            raise PreferenceError(f"{kind}.{extra[0]}"[:100], "is not a field (email, webhooks)")
        email = choice.get("email", DEFAULT_EMAIL)
        if not isinstance(email, bool):
            raise PreferenceError(f"{kind}.email", "must be true or false")
        hooks = choice.get("webhooks", [])
        if not isinstance(hooks, list) or not all(isinstance(h, str) for h in hooks):
            raise PreferenceError(f"{kind}.webhooks", "must be a list of webhook names")
        unknown = [h for h in hooks if h not in known]
        if unknown:
            offered = (
                ", ".join(sorted(known)) or "none: the operator configured no webhook (TAILTUNE_WEBHOOKS)"
            )
            raise PreferenceError(
                f"{kind}.webhooks", f"{unknown[0][:64]!r} is not a webhook here (offered: {offered})"
            )
        out[kind] = (email, sorted(set(hooks)))
    return out


@transaction.atomic
def preferences_set(*, user: Any, choices: Any) -> dict[str, dict[str, Any]]:
    """Store the user's choices for the kinds given (the others keep theirs); all or nothing.
    Raises PreferenceError naming the field."""
    for kind, (email, hooks) in _clean(choices).items():
        NotificationPreference.objects.update_or_create(
            user=user, kind=kind, defaults={"email": email, "webhooks": hooks}
        )
    return preferences_get(user=user)


# -- making notifications from audit events -------------------------------------------------


def _facts(event: AuditEvent) -> events.Facts:
    experiment = event.experiment
    if experiment is None:
        return events.Facts()
    decision = getattr(experiment, "decision", None) if hasattr(experiment, "decision") else None
    chosen = ""
    if decision is not None and decision.chosen_cell:
        is_b0 = experiment.cells.filter(cell_id=decision.chosen_cell, role="baseline").exists()
        chosen = "" if is_b0 else decision.chosen_cell
    recovery = ((decision.checks or {}).get("recovery") or {}) if decision is not None else {}
    return events.Facts(
        name=f"{experiment.name} (#{experiment.pk})",
        outcome=decision.outcome if decision is not None else "",
        chosen_cell=chosen,
        recovery_status=str(recovery.get("status") or ""),
    )


def _audience(event: AuditEvent, wanted: events.Wanted) -> list[Any]:
    users: dict[int, Any] = {}
    owner = event.experiment.owner if event.experiment is not None else None
    if events.AUTHOR in wanted.audience and owner is not None:
        users[owner.pk] = owner
    if events.APPROVERS in wanted.audience:
        for user in get_user_model().objects.filter(groups__name=APPROVER, is_active=True):
            # Nobody approves their own experiment: the author is not asked to.
            if wanted.kind == events.APPROVAL_WAITING and owner is not None and user.pk == owner.pk:
                continue
            users[user.pk] = user
    return [u for u in users.values() if u.is_active]


def _payload(event: AuditEvent, wanted: events.Wanted) -> dict[str, Any]:
    experiment = event.experiment
    base = getattr(settings, "PUBLIC_URL", "").rstrip("/")
    return {
        "kind": wanted.kind,
        "summary": wanted.summary,
        "experiment": None
        if experiment is None
        else {
            "id": experiment.pk,
            "name": experiment.name,
            "status": experiment.status,
            "url": f"{base}{reverse('experiments:detail', args=[experiment.pk])}",
        },
        "event": {"id": event.pk, "action": event.action, "at": event.at.isoformat(), "target": event.target},
    }


def notify_audit_event(event: AuditEvent) -> list[Notification]:
    """Make the notifications an audit event calls for, and send each after commit."""
    made: list[Notification] = []
    wanted_list = events.wanted(event.action, event.detail or {}, _facts(event))
    if not wanted_list:
        return made
    hooks = getattr(settings, "TAILTUNE_WEBHOOKS", {}) or {}
    for wanted in wanted_list:
        payload = _payload(event, wanted)
        for user in _audience(event, wanted):
            choice = preferences_get(user=user)[wanted.kind]
            targets: list[tuple[str, str]] = []
            if choice["email"] and user.email:
                targets.append((Notification.Channel.EMAIL, user.email))
            targets += [(Notification.Channel.WEBHOOK, name) for name in choice["webhooks"] if name in hooks]
            for channel, target in targets:
                row, created = Notification.objects.get_or_create(
                    event=event,
                    user=user,
                    kind=wanted.kind,
                    channel=channel,
                    target=target,
                    defaults={
                        "experiment": event.experiment,
                        "subject": f"[tailtune] {wanted.summary}"[:300],
                        "payload": payload,
                    },
                )
                if created:
                    made.append(row)
                    dispatch.send_on_commit(
                        dispatch.NOTIFY,
                        kwargs={"notification_pk": row.pk},
                        queue=settings.CELERY_TASK_DEFAULT_QUEUE,
                    )
    return made


# -- delivery ---------------------------------------------------------------------------------


def _send(row: Notification) -> int | None:
    """One attempt; returns the webhook's HTTP status (None for email). Raises on failure."""
    if row.channel == Notification.Channel.EMAIL:
        experiment = row.payload.get("experiment") or {}
        body = f"{row.payload.get('summary', '')}\n\n{experiment.get('url', '')}\n".strip() + "\n"
        send_mail(row.subject, body, settings.DEFAULT_FROM_EMAIL, [row.target], fail_silently=False)
        return None
    url = (getattr(settings, "TAILTUNE_WEBHOOKS", {}) or {}).get(row.target)
    if url is None:
        raise LookupError(f"webhook {row.target!r} is no longer configured (TAILTUNE_WEBHOOKS)")
    response = httpx.post(url, json=row.payload, timeout=WEBHOOK_TIMEOUT)
    if response.status_code >= 300:
        raise httpx.HTTPStatusError(
            f"HTTP {response.status_code}: {response.text[:200]}", request=response.request, response=response
        )
    return response.status_code


def notification_deliver(*, notification_id: int) -> str:
    """Make one attempt to send the notification, and record it on the row.

    Sent or failed for good: nothing more to do (a redelivered task sends nothing twice).
    A failed attempt with attempts left raises DeliveryFailed (the task retries later); the last
    one marks the row failed. A webhook the operator removed is not retried."""
    with transaction.atomic():
        row = Notification.objects.select_for_update().filter(pk=notification_id).first()
        if row is None or row.status != Notification.Status.PENDING:
            return f"skipped ({row.status if row else 'no such notification'})"
        row.attempts += 1
        attempt: dict[str, Any] = {
            "at": timezone.now().isoformat(),
            "ok": True,
            "error": "",
            "status_code": None,
        }
        retry = False
        try:
            attempt["status_code"] = _send(row)
        except Exception as exc:
            if isinstance(exc, httpx.HTTPStatusError):
                attempt["status_code"] = exc.response.status_code
            error = f"{type(exc).__name__}: {exc}"[:1000]
            attempt.update(ok=False, error=error)
            row.last_error = error
            retry = row.attempts < MAX_ATTEMPTS and not isinstance(exc, LookupError)
            if not retry:
                row.status = Notification.Status.FAILED
        else:
            row.status = Notification.Status.SENT
            row.sent_at = timezone.now()
        row.attempt_log = [*row.attempt_log, attempt]
        row.save(update_fields=["attempts", "attempt_log", "last_error", "status", "sent_at"])
    if retry:
        raise DeliveryFailed(
            f"notification {notification_id}: attempt {row.attempts} failed: {row.last_error}"
        )
    return f"{row.status} after {row.attempts} attempt(s)"
