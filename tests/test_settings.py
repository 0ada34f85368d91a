"""Settings from the environment: SQLite by default, PostgreSQL and Redis by URL."""

import json
import subprocess
import sys

import pytest

from remixstudio.settings import database_from_url


def settings_in_child(**env) -> dict:
    code = (
        "import json, django; from django.conf import settings; django.setup();"
        "print(json.dumps({'db': settings.DATABASES['default'], 'q': settings.Q_CLUSTER,"
        " 'layer': settings.CHANNEL_LAYERS['default']['BACKEND']}, default=str))"
    )
    base = {"DJANGO_SETTINGS_MODULE": "remixstudio.settings", "PATH": "/usr/bin:/bin", "DATABASE_URL": "", "REDIS_URL": ""}
    base["DEBUG"] = "True"  # development keys; these tests are about the database and broker
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_default_is_sqlite_with_wal_and_immediate_transactions():
    db = database_from_url("")
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]
    assert db["OPTIONS"]["timeout"] >= 5


def test_a_postgres_url_uses_psycopg_with_persistent_checked_connections():
    db = database_from_url("postgres://app:pw@db.example:5433/remix")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == ("remix", "app", "pw", "db.example", 5433)
    assert db["CONN_MAX_AGE"] > 0 and db["CONN_HEALTH_CHECKS"] is True


def test_without_redis_the_orm_broker_and_in_memory_layer_are_used():
    s = settings_in_child()
    assert s["q"]["orm"] == "default" and "redis" not in s["q"]
    assert s["layer"] == "channels.layers.InMemoryChannelLayer"
    assert s["q"]["save_limit"] == -1 and s["q"]["retry"] > s["q"]["timeout"]


def test_redis_url_switches_the_broker_and_the_channel_layer():
    s = settings_in_child(REDIS_URL="redis://cache.example:6380/2", DATABASE_URL="postgres://u@h/db")
    assert s["q"]["redis"] == "redis://cache.example:6380/2" and "orm" not in s["q"]
    assert s["layer"] == "channels_redis.core.RedisChannelLayer"
    assert s["db"]["ENGINE"] == "django.db.backends.postgresql"


def test_a_postgres_connection_gives_up_on_a_vanished_peer_within_seconds_at_both_ends():
    # A host cut off mid-transaction kept its row locks (a provider's dispatch lock, a
    # job's poll claim) until the link came back, and its own queries hung for the
    # kernel's minutes of retransmission: both ends must notice a silent peer in seconds.
    db = database_from_url("postgres://app:pw@db.example:5433/remix")
    options = db["OPTIONS"]
    assert options["keepalives"] == 1 and options["keepalives_idle"] <= 3 and options["keepalives_count"] <= 5
    assert 0 < options["tcp_user_timeout"] <= 10_000 and options["connect_timeout"] <= 10
    server = dict(part.split("=") for part in options["options"].replace("-c ", "").split())
    assert int(server["tcp_keepalives_idle"]) <= 3 and int(server["tcp_user_timeout"]) <= 10_000


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_server_drops_a_session_whose_client_went_silent_within_seconds():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, setting::int FROM pg_settings WHERE name IN "
            "('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout')"
        )
        server = dict(cursor.fetchall())
    # Seconds until an idle session's silent client is given up on, and ms for unanswered data.
    assert 0 < server["tcp_keepalives_idle"] + server["tcp_keepalives_interval"] * server["tcp_keepalives_count"] <= 10
    assert 0 < server["tcp_user_timeout"] <= 10_000


def test_a_throwaway_database_may_commit_without_waiting_for_the_disk(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    url = "postgres://u@db.example:5432/q"
    monkeypatch.setenv("DB_SYNCHRONOUS_COMMIT", "off")
    assert database_from_url(url)["OPTIONS"]["options"].endswith(" -c synchronous_commit=off")
    monkeypatch.setenv("DB_SYNCHRONOUS_COMMIT", "")
    assert "synchronous_commit" not in database_from_url(url)["OPTIONS"]["options"]
    monkeypatch.setenv("DB_SYNCHRONOUS_COMMIT", "off; drop table x")
    with pytest.raises(ImproperlyConfigured, match="DB_SYNCHRONOUS_COMMIT"):
        database_from_url(url)
