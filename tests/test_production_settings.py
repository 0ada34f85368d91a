"""Safe by default in production (issue 18 §7).

- DEBUG is off unless the environment asks for it; with DEBUG off, a missing SECRET_KEY or
  FIELD_ENCRYPTION_KEY (or one that is not a Fernet key) stops start-up with a message
  saying what to set; with DEBUG on, development keys are used;
- the demo account is an ordinary user (an older superuser demo is demoted) that sees its
  own queue on the monitor and nobody else's;
- failed logins are throttled per account and address: after the limit, that username
  from that address is refused (429) even with the right password, while the same account
  from another address and another account from the same address still log in.

(`manage.py check --deploy` in the documented production configuration: test_security.)
"""

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from queue_app.models import Provider
from tests.conftest import make_provider

ROOT = Path(__file__).resolve().parent.parent
FERNET = "dGVzdC1vbmx5LWZlcm5ldC1rZXktMzItYnl0ZXMhISE="


def start(tmp_path, **env) -> subprocess.CompletedProcess:
    """`manage.py check` in a clean environment plus `env`: how a process starts."""
    base = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "remixstudio.settings", "VAR_DIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "from django.conf import settings; print('DEBUG', settings.DEBUG)"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_configuration_start_up_stops_and_says_what_to_set(tmp_path):
    result = start(tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY and FIELD_ENCRYPTION_KEY must be set when DEBUG is off" in result.stderr
    result = start(tmp_path, SECRET_KEY="s" * 50)
    assert result.returncode != 0 and "FIELD_ENCRYPTION_KEY must be set" in result.stderr
    result = start(tmp_path, SECRET_KEY="s" * 50, FIELD_ENCRYPTION_KEY="not-a-key")
    assert result.returncode != 0 and "not a Fernet key" in result.stderr


def manage(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "remixstudio.settings", "VAR_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_migration_check_needs_no_production_secrets_but_serving_and_migrating_do(tmp_path):
    assert manage(tmp_path, "makemigrations", "--check", "--dry-run").returncode == 0
    assert manage(tmp_path, "check").returncode == 0
    for refused in (("migrate", "--plan"), ("check", "--deploy")):
        result = manage(tmp_path, *refused)
        assert result.returncode != 0 and "SECRET_KEY and FIELD_ENCRYPTION_KEY must be set" in result.stderr, refused


def test_debug_is_off_unless_asked_for(tmp_path):
    production = start(tmp_path, SECRET_KEY="s" * 50, FIELD_ENCRYPTION_KEY=FERNET)
    assert production.returncode == 0 and "DEBUG False" in production.stdout, production.stderr
    development = start(tmp_path, DEBUG="True")  # what `make run` sets: development keys
    assert development.returncode == 0 and "DEBUG True" in development.stdout, development.stderr


# --- the demo account ---------------------------------------------------------------------


@pytest.mark.django_db
def test_the_demo_account_is_an_ordinary_user_that_sees_its_own_queue(django_user_model, monkeypatch, outsider):
    monkeypatch.setenv("DEMO_PASSWORD", "demo-pass-123")
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    demo = django_user_model.objects.get(username="demo")
    assert not demo.is_staff and not demo.is_superuser
    make_provider(outsider, name="Outsider's provider")
    client = Client()
    client.force_login(demo)
    page = client.get("/queue/").content.decode()
    assert "Demo async" in page and "Outsider&#x27;s provider" not in page and "Outsider's provider" not in page
    assert client.get("/admin/").status_code == 302  # no admin


@pytest.mark.django_db
def test_seeding_again_demotes_a_demo_superuser_of_an_older_version(django_user_model, monkeypatch):
    django_user_model.objects.create_user(username="demo", password="x", is_staff=True, is_superuser=True)
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    call_command("seed_demo", stdout=open("/dev/null", "w"))
    demo = django_user_model.objects.get(username="demo")
    assert not demo.is_staff and not demo.is_superuser
    assert Provider.objects.filter(owner=demo).count() == 2


# --- login throttling -----------------------------------------------------------------------


def attempt(username, password, address):
    client = Client(REMOTE_ADDR=address)
    response = client.post("/accounts/login/", {"username": username, "password": password})
    return response.status_code, "_auth_user_id" in client.session


@pytest.mark.django_db
def test_failed_logins_are_throttled_per_account_and_address(owner, outsider, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt("owner", "wrong", "203.0.113.7") == (200, False)
    assert attempt("owner", "wrong", "203.0.113.7") == (429, False)  # the limit-th failure locks
    assert attempt("owner", "pw-owner", "203.0.113.7") == (429, False)  # locked, even with the password
    assert attempt("owner", "pw-owner", "198.51.100.9") == (302, True)  # the account from elsewhere
    assert attempt("outsider", "pw-outsider", "203.0.113.7") == (302, True)  # another account from there


@pytest.mark.django_db
def test_a_successful_login_resets_the_count(owner, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt("owner", "wrong", "203.0.113.8")
    assert attempt("owner", "pw-owner", "203.0.113.8") == (302, True)
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt("owner", "wrong", "203.0.113.8") == (200, False)
    assert attempt("owner", "pw-owner", "203.0.113.8") == (302, True)
