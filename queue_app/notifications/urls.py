from django.urls import path

from queue_app.notifications import views

urlpatterns = [
    path("account/preferences/", views.preferences, name="account_preferences"),
    path("push/subscribe", views.push_subscribe, name="push_subscribe"),
    path("push/unsubscribe", views.push_unsubscribe, name="push_unsubscribe"),
    path("push/status", views.push_status, name="push_status"),
    path("push/test", views.push_test, name="push_test"),
    path("sw.js", views.service_worker, name="service_worker"),
]
