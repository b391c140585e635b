"""The allauth pages the console uses, and no others: no sign-up form, no e-mail management,
no password reset by mail (an admin resets a password); sign-in, two-factor, single sign-on and
the list of one's sessions."""

from __future__ import annotations

from allauth.account import views as account_views
from allauth.socialaccount.providers.openid_connect import views as oidc_views
from django.urls import include, path

from accounts.views import sessions, sso

urlpatterns = [
    path("login/", account_views.login, name="account_login"),
    path("logout/", account_views.logout, name="account_logout"),
    path("inactive/", account_views.account_inactive, name="account_inactive"),
    path("reauthenticate/", account_views.reauthenticate, name="account_reauthenticate"),
    path("password/change/", account_views.password_change, name="account_change_password"),
    path("2fa/", include("allauth.mfa.urls")),
    path("3rdparty/", include("allauth.socialaccount.urls")),
    # OpenID Connect: /accounts/oidc/<provider id>/login/ and .../login/callback/.
    path("oidc/<str:provider_id>/login/", oidc_views.login, name="openid_connect_login"),
    path(
        "oidc/<str:provider_id>/login/callback/",
        oidc_views.callback,
        name="openid_connect_callback",
    ),
    # allauth's own name, so its links find the console's page of one's sessions.
    path("sessions/", sessions.sessions, name="usersessions_list"),
    # The console's own: an invitation followed through a provider; a tenant's Sign-in page.
    path("sso/<str:provider_id>/invitation/", sso.invitation_sso, name="sso-invitation"),
    path("sign-in/", sso.sign_in_settings, name="sign-in-settings"),
    path("sign-in/save/", sso.sign_in_save, name="sign-in-save"),
    path("sign-in/mappings/", sso.mapping_add, name="sso-mapping-add"),
    path("sign-in/mappings/remove/", sso.mapping_remove, name="sso-mapping-remove"),
]
