from __future__ import annotations

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    # The console's own pages arrive with the browser issue; until then the admin is home.
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
