from django.urls import path, re_path

from . import usage, views

app_name = "api"

urlpatterns = [
    path("requests/", views.RequestListCreate.as_view(), name="request-list"),
    path("requests/cancel/", views.RequestCancelMany.as_view(), name="request-cancel-many"),
    path("requests/release/", views.RequestRelease.as_view(), name="request-release"),
    path("requests/<int:pk>/", views.RequestDetail.as_view(), name="request-detail"),
    path("requests/<int:pk>/cancel/", views.RequestCancel.as_view(), name="request-cancel"),
    path("bulks/", views.BulkList.as_view(), name="bulk-list"),
    path("bulks/<uuid:pk>/", views.BulkDetail.as_view(), name="bulk-detail"),
    path("bulks/<uuid:pk>/cancel/", views.BulkCancel.as_view(), name="bulk-cancel"),
    path("bulks/<uuid:pk>/summary/", views.BulkSummary.as_view(), name="bulk-summary"),
    *(path(f"bulks/<uuid:pk>/{what}.{fmt}", views.BulkDownload.as_view(what=what, fmt=fmt),
           name=f"bulk-{what}-{fmt}") for what, fmt in views.DOWNLOADS),
    path("summary/", views.Summary.as_view(), name="summary"),
    path("stager/", views.StagerHealthView.as_view(), name="stager"),
    path("usage/", usage.UsageView.as_view(), name="usage"),
    path("usage/csv/", usage.UsageCsvView.as_view(), name="usage-csv"),
    # Last: anything else under the API is a JSON 404 (an unknown id such as requests/abc/).
    re_path(r"", views.NotFoundView.as_view()),
]
