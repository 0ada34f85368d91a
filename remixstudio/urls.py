from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/projects/", permanent=False)),
    # what browsers and tools ask for without reading the pages' <link rel="icon">
    path("favicon.ico", lambda request: HttpResponseRedirect(static("queue_app/favicon.svg"))),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("queue_app.web.urls")),
    path("", include("queue_app.web.ops_urls")),  # health, metrics, workers, bulk actions
    path("", include("queue_app.notifications.urls")),
    path("", include("comfy_app.urls")),
]
