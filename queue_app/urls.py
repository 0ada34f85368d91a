from django.urls import path

from queue_app import views

urlpatterns = [
    path("projects/", views.project_list, name="project_list"),
    path("projects/<int:project_id>/", views.project_detail, name="project_detail"),
    path("projects/<int:project_id>/start", views.project_start, name="project_start"),
    path("projects/<int:project_id>/drafts", views.project_drafts, name="project_drafts"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job_detail"),
    path("providers/", views.provider_list, name="provider_list"),
    path("providers/new", views.provider_edit, name="provider_new"),
    path("providers/<int:provider_id>/", views.provider_edit, name="provider_edit"),
    path("album/<int:item_id>/file", views.album_file, name="album_file"),
    path("album/<int:item_id>/poster", views.album_file, {"variant": "poster"}, name="album_poster"),
]
