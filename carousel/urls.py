from django.contrib import admin
from django.urls import include, path, re_path
from api.tape_rest.views import Discovery
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from carousel.ops.metrics import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("api.urls")),
    re_path(r"^\.well-known/wlcg-tape-rest-api/?$", Discovery.as_view(), name="wlcg-tape-rest-discovery"),
    path("api/tape-rest/v1/", include("api.tape_rest.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("", include("frontend.urls")),
]

# A request Django refuses before any view (a Host header not in ALLOWED_HOSTS): each door's format.
handler400 = "api.errors.bad_request"
