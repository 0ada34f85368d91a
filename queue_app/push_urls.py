from django.urls import path

from queue_app import push_views

urlpatterns = [
    path("account/preferences/", push_views.preferences, name="account_preferences"),
    path("push/subscribe", push_views.push_subscribe, name="push_subscribe"),
    path("push/unsubscribe", push_views.push_unsubscribe, name="push_unsubscribe"),
    path("push/status", push_views.push_status, name="push_status"),
    path("push/test", push_views.push_test, name="push_test"),
    path("sw.js", push_views.service_worker, name="service_worker"),
]
