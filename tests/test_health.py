"""/livez, /readyz, /fleetz and /healthz: public JSON for supervisors, load balancers and
alerts, 503 when not ok."""

import socket
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.models import Heartbeat

pytestmark = pytest.mark.django_db


def without_redis(settings):
    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def test_healthz_answers_ok_without_login_when_the_database_answers(client, settings):
    without_redis(settings)
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "checks": {"database": "ok"}}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_is_503_when_the_configured_redis_is_unreachable(client, settings):
    without_redis(settings)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "checks": {"database": "ok", "redis": "down"}}


@pytest.mark.redis
def test_healthz_checks_the_real_redis_when_configured(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json()["checks"]["redis"] == "ok"


def test_healthz_is_503_when_the_database_fails(client, settings, monkeypatch):
    without_redis(settings)

    def broken_cursor(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr("queue_app.web.health.connection.cursor", broken_cursor)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "checks": {"database": "down"}}
    assert "refused" not in response.content.decode()  # no error text in a public body


def test_fleetz_is_503_until_a_queue_service_and_a_cluster_are_alive(client):
    response = client.get("/fleetz")
    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "queue_services": 0, "workers": 0}
    heartbeats.beat("worker")
    assert client.get("/fleetz").status_code == 503  # a cluster alone cannot poll or heal
    heartbeats.beat("queue_service")
    response = client.get("/fleetz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "checks": {"database": "ok", "queue_services": 1, "workers": 1}}


def test_fleetz_does_not_count_a_process_whose_heartbeat_is_stale(client):
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")
    Heartbeat.objects.filter(role="queue_service").update(seen_at=timezone.now() - timedelta(minutes=5))
    response = client.get("/fleetz")
    assert response.status_code == 503 and response.json()["checks"]["queue_services"] == 0


def test_readyz_is_200_with_no_worker_alive_the_web_can_serve(client, settings):
    without_redis(settings)
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "checks": {"database": "ok"}}


def test_readyz_is_503_when_the_database_fails_and_livez_stays_200(client, settings, monkeypatch):
    without_redis(settings)

    def broken_cursor(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr("queue_app.web.health.connection.cursor", broken_cursor)
    assert client.get("/readyz").status_code == 503
    assert client.get("/fleetz").json() == {"ok": False, "checks": {"database": "down"}}
    response = client.get("/livez")
    assert response.status_code == 200 and response.json() == {"ok": True, "checks": {"process": "ok"}}


def test_readyz_checks_the_channel_layers_redis_not_only_redis_url(client, settings):
    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}
    }
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["checks"] == {"database": "ok", "redis": "down"}


def test_readyz_is_503_when_redis_url_answers_but_is_not_redis(client, settings):
    """Something listens on the configured port but does not speak Redis (a wrong port)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_like_http():
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=answer_like_http, daemon=True)
    thread.start()
    without_redis(settings)
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    try:
        response = client.get("/readyz")
    finally:
        thread.join(timeout=5)
        listener.close()
    assert response.status_code == 503 and response.json()["checks"]["redis"] == "down"


def test_health_checks_refuse_writes(client):
    for url in ("/livez", "/readyz", "/fleetz", "/healthz"):
        assert client.post(url).status_code == 405, url
