from django.urls import path

from apps.accounts import views

app_name = "accounts"

urlpatterns = [
    path("tokens/", views.token_page, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke_view, name="token_revoke"),
]
