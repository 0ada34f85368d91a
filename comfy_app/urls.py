from django.urls import path

from comfy_app import views

urlpatterns = [
    path("projects/<int:project_id>/comfyui/", views.comfy_settings, name="comfy_settings"),
    path("projects/<int:project_id>/comfyui/test", views.comfy_test, name="comfy_test"),
    path("comfy/allowed-hosts/", views.allowed_hosts_page, name="comfy_allowed_hosts"),
]
