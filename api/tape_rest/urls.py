"""Every route with and without its trailing slash: Debian's gfal2 posts to `stage/` and
`archiveinfo/` but to `stage/{id}/cancel` and `release/{id}`, and a redirect from a POST loses
its body."""
from django.urls import re_path

from . import views

app_name = "tape_rest"

urlpatterns = [
    re_path(r"^stage/?$", views.Stage.as_view(), name="stage"),
    re_path(r"^stage/(?P<request_id>[^/]+)/?$", views.StageDetail.as_view(), name="stage-detail"),
    re_path(r"^stage/(?P<request_id>[^/]+)/cancel/?$", views.StageCancel.as_view(), name="stage-cancel"),
    re_path(r"^release/(?P<request_id>[^/]+)/?$", views.Release.as_view(), name="release"),
    re_path(r"^archiveinfo/?$", views.ArchiveInfo.as_view(), name="archiveinfo"),
    re_path(r"", views.NotFound.as_view()),
]
