from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from api.v1 import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path(
        "login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("sessions/", include("sessions_admin.urls")),
    path("notifications/", include("notifications.urls")),
    path("api/v1/", api.urls),
    path("", include("api.urls")),
    path("", include("approvals.urls")),
]
