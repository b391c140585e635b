from __future__ import annotations

from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.index, name="index"),
    path("<slug:tenant>/webhooks/", views.endpoint_list, name="webhooks"),
    path("<slug:tenant>/webhooks/<int:endpoint>/", views.endpoint_edit, name="webhook"),
    path("<slug:tenant>/webhooks/<int:endpoint>/delete/", views.endpoint_delete, name="delete"),
    path("<slug:tenant>/webhooks/<int:endpoint>/ping/", views.endpoint_ping, name="ping"),
    path("<slug:tenant>/deliveries/", views.delivery_log, name="deliveries"),
    path("<slug:tenant>/deliveries/<int:delivery>/retry/", views.delivery_retry, name="retry"),
    path("<slug:tenant>/emails/", views.email_log, name="emails"),
    path("<slug:tenant>/emails/<int:email>/retry/", views.email_retry, name="email_retry"),
]
