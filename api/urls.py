"""``/account/`` (the self-service key page) and ``/api/v1/`` (the management REST API, ``api.rest``)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy
from django.views.generic import RedirectView

from api import account

app_name = "account"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="account:keys"), name="index"),
    path("login/", account.AccountLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page=reverse_lazy("account:login")), name="logout"),
    path("invite/<uidb64>/<token>/", account.AccountInviteView.as_view(), name="invite"),
    path("keys/", account.keys, name="keys"),
    path("keys/create/", account.create, name="create"),
    path("keys/<int:membership_id>/<int:key_id>/revoke/", account.revoke, name="revoke"),
]
