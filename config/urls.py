from __future__ import annotations

from allauth.account import views as account_views
from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path

from api.v1 import api

# The admin signs in through the console's own sign-in (lockout, single sign-on, two-factor).
admin.site.login = login_required(admin.site.login)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", account_views.LoginView.as_view(), name="login"),
    path("logout/", account_views.LogoutView.as_view(), name="logout"),
    path("accounts/", include("accounts.urls")),
    path("sessions/", include("sessions_admin.urls")),
    path("notifications/", include("notifications.urls")),
    path("api/v1/", api.urls),
    path("", include("api.urls")),
    path("", include("approvals.urls")),
]
