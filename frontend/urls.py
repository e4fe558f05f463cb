from django.urls import path

from . import usage, views

app_name = "frontend"
urlpatterns = [
    path("", views.requests_page, name="requests"),
    path("restore/", views.restore, name="restore"),
    path("requests/cancel/", views.cancel, name="cancel"),
    path("live/", views.live, name="live"),
    path("live/fragment/", views.live_fragment, name="live-fragment"),
    path("usage/", usage.usage_page, name="usage"),
]
