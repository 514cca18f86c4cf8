from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path


def favicon(request: HttpRequest) -> HttpResponse:
    # Browsers ask for /favicon.ico whatever the page says. Resolved per request, so the
    # hashed name of a collected (manifest) static file is used.
    return HttpResponsePermanentRedirect(static("favicon.svg"))


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


# A 400 shows the message of a value a view refused (config/params.py BadValue), naming its field.
handler400 = "config.params.bad_request"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon, name="favicon"),
    path("api/v1/", include("apps.api.urls")),
    path("accounts/", include("apps.accounts.urls")),
    path("", include("apps.experiments.urls")),
    path("", include("apps.runs.urls")),
    path("", include("apps.approvals.urls")),
    path("", include("apps.notifications.urls")),
    path("", include("apps.history.urls")),
]
