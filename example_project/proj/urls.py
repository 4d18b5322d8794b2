"""URLs of the example project: the Django admin, with the outcome journal in it."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
