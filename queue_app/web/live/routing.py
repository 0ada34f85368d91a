from django.urls import re_path

from queue_app.web.live import consumers

websocket_urlpatterns: list = [
    re_path(r"^ws/projects/(?P<project_id>\d+)/$", consumers.ProjectConsumer.as_asgi()),
]
