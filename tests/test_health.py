"""/healthz and /readyz: public JSON for load balancers and supervisors, 503 when not ok."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.models import Heartbeat

pytestmark = pytest.mark.django_db


def test_healthz_answers_ok_without_login_when_the_database_answers(client, settings):
    settings.REDIS_URL = ""
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "checks": {"database": "ok"}}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_is_503_when_the_configured_redis_is_unreachable(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "checks": {"database": "ok", "redis": "down"}}


@pytest.mark.redis
def test_healthz_checks_the_real_redis_when_configured(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json()["checks"]["redis"] == "ok"


def test_healthz_is_503_when_the_database_fails(client, settings, monkeypatch):
    settings.REDIS_URL = ""

    def broken_cursor(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr("queue_app.web.health.connection.cursor", broken_cursor)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"ok": False, "checks": {"database": "down"}}
    assert "refused" not in response.content.decode()  # no error text in a public body


def test_readyz_is_503_until_a_queue_service_and_a_cluster_are_alive(client):
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "queue_services": 0, "workers": 0}
    heartbeats.beat("worker")
    assert client.get("/readyz").status_code == 503  # a cluster alone cannot poll or heal
    heartbeats.beat("queue_service")
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "checks": {"database": "ok", "queue_services": 1, "workers": 1}}


def test_readyz_does_not_count_a_process_whose_heartbeat_is_stale(client):
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")
    Heartbeat.objects.filter(role="queue_service").update(seen_at=timezone.now() - timedelta(minutes=5))
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["checks"]["queue_services"] == 0


def test_health_checks_refuse_writes(client):
    assert client.post("/healthz").status_code == 405
