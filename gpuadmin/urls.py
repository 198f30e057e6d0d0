from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from gpuadmin import views

urlpatterns = [
    path("", views.home, name="home"),
    path("-/health", views.health, name="health"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("inventory.urls")),
    path("", include("inventory.api.urls")),
    path("", include("scheduling.api.urls")),
    path("", include("scheduling.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]

admin.site.site_header = "gpuadmin"
admin.site.site_title = "gpuadmin"
admin.site.index_title = "Fleet catalog"
