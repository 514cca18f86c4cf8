"""The API tokens page: create (shown once), list, revoke. Never cached: it may show a secret."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from apps.accounts.models import ApiToken
from apps.accounts.tokens import SCOPES, TokenError, role_scopes, token_create, token_days, token_revoke
from apps.audit.services import audit_record


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. 'ci-gate'; it labels the audit log.")
    scopes = forms.MultipleChoiceField(
        choices=[(scope, f"{scope}: {what}") for scope, (what, _) in SCOPES.items()],
        widget=forms.CheckboxSelectMultiple,
        initial=["read"],
        help_text="What the token may do; never more than your roles allow. A CI gate needs read and run.",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        granted = role_scopes(user)  # only what the user's roles grant is offered
        scopes = self.fields["scopes"]
        scopes.choices = [(value, label) for value, label in scopes.choices if value in granted]  # type: ignore[attr-defined]
        days = token_days()
        self.fields["expires_days"] = forms.IntegerField(
            required=False,
            min_value=1,
            max_value=days,
            label="Expires after (days)",
            help_text=f"Empty: {days} days, the longest a token lives (TAILTUNE_TOKEN_DAYS).",
        )


@never_cache
def token_page(request: HttpRequest) -> HttpResponse:
    shown = None
    if request.method == "POST":
        form = TokenForm(request.POST, user=request.user)
        if form.is_valid():
            try:
                token, shown = token_create(
                    user=request.user,
                    name=form.cleaned_data["name"],
                    scopes=form.cleaned_data["scopes"],
                    expires_days=form.cleaned_data["expires_days"],
                )
            except TokenError as exc:
                field, _, message = str(exc).partition(": ")
                form.add_error({"name": "name", "scopes": "scopes"}.get(field, "expires_days"), message)
            else:
                audit_record(
                    action="token.created",
                    actor=request.user,
                    target=token.name,
                    detail={"scopes": token.scopes, "expires_at": token.expires_at.isoformat()},
                )
                form = TokenForm(user=request.user)
    else:
        form = TokenForm(user=request.user)
    tokens = ApiToken.objects.filter(user_id=int(request.user.pk or 0))
    return render(
        request,
        "accounts/tokens.html",
        {"form": form, "tokens": tokens, "shown": shown},
        status=400 if request.method == "POST" and shown is None else 200,
    )


@require_POST
def token_revoke_view(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk, user_id=request.user.pk)
    token_revoke(token=token, actor=request.user)
    audit_record(action="token.revoked", actor=request.user, target=token.name)
    messages.success(request, f"Revoked the token {token.name!r}: it no longer authenticates.")
    return redirect("accounts:tokens")
