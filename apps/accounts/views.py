"""The API tokens page: create (shown once), list, revoke."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.models import ApiToken
from apps.accounts.tokens import MAX_EXPIRES_DAYS, TokenError, token_create, token_revoke
from apps.approvals.audit import audit_record


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. 'ci-gate'; it labels the audit log.")
    expires_days = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_EXPIRES_DAYS, label="Expires after (days)",
        help_text="Empty: never expires (revoke it when it is no longer used).",
    )  # fmt: skip


def token_page(request: HttpRequest) -> HttpResponse:
    shown = None
    if request.method == "POST":
        form = TokenForm(request.POST)
        if form.is_valid():
            try:
                token, shown = token_create(
                    user=request.user,
                    name=form.cleaned_data["name"],
                    expires_days=form.cleaned_data["expires_days"],
                )
            except TokenError as exc:
                form.add_error(
                    "name" if str(exc).startswith("name") else "expires_days", str(exc).split(": ", 1)[1]
                )
            else:
                audit_record(action="token.created", actor=request.user, target=token.name)
                form = TokenForm()
    else:
        form = TokenForm()
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
