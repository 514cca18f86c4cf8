"""Every page needs a login, except the login page and static files."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse

# /api/ authenticates every call with a bearer token itself (apps/api/auth.py).
_OPEN_PREFIXES = ("/accounts/login/", "/static/", "/healthz", "/api/", "/favicon.ico")


class LoginRequiredEverywhere:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.user.is_authenticated and not request.path.startswith(_OPEN_PREFIXES):
            if request.path.startswith("/admin/"):
                return self.get_response(request)  # the admin has its own login
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)
