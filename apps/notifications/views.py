"""/notifications/: choose what you are told, and see what was sent to you."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.notifications import events
from apps.notifications.models import Notification
from apps.notifications.services import PreferenceError, preferences_get, preferences_set, webhook_names

SHOWN = 50


@login_required
def preferences_page(request: HttpRequest) -> HttpResponse:
    prefs = preferences_get(user=request.user)
    hooks = webhook_names()
    rows = [
        {
            "kind": kind,
            "label": label,
            "email": prefs[kind]["email"],
            "webhooks": [(name, name in prefs[kind]["webhooks"]) for name in hooks],
        }
        for kind, label in events.KINDS.items()
    ]
    user: Any = request.user  # login_required: a real user
    sent = Notification.objects.filter(user=user).select_related("experiment")[:SHOWN]
    return render(
        request,
        "notifications/preferences.html",
        {"rows": rows, "hooks": hooks, "sent": sent, "email": user.email},
    )


@login_required
@require_POST
def preferences_save(request: HttpRequest) -> HttpResponse:
    choices = {
        kind: {
            "email": request.POST.get(f"{kind}-email") == "on",
            "webhooks": request.POST.getlist(f"{kind}-webhooks"),
        }
        for kind in events.KINDS
    }
    try:
        preferences_set(user=request.user, choices=choices)
    except PreferenceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Saved.")
    return redirect("notifications:preferences")
