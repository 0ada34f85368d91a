"""Personas and helpers shared by the suite.

Personas: `owner` (the user whose things we act on), `outsider` (another user), `staff`.
Tasks the code enqueues are captured by `inline_tasks` and run when a test says so, so a
test controls exactly when a worker "picks up" a job.
"""

import os

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

import pytest  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth.hashers import PBKDF2PasswordHasher  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import override_settings  # noqa: E402

from queue_app.models import Job, Status  # noqa: E402
from tests.factories import make_drafts, make_job, make_project, make_provider, make_user  # noqa: E402

# Debian's Chromium, which the browser tests drive. Under `make test` (REQUIRE_BROWSER=1)
# a missing one fails those tests with how to install it, instead of skipping them quietly.
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
BROWSER_MISSING = f"needs Debian's Chromium at {CHROMIUM}: sudo apt-get install chromium (make test installs it when run as root)"


@pytest.fixture(autouse=True)
def _browser_required(request):
    # Autouse, so it runs before a test's own fixtures (and their skip for a missing browser).
    if request.node.get_closest_marker("browser") and not os.path.exists(CHROMIUM):
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(BROWSER_MISSING, pytrace=False)
        pytest.skip(BROWSER_MISSING)


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("postgres") and "postgres" not in settings.DATABASES["default"]["ENGINE"]:
            item.add_marker(pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)"))
        if item.get_closest_marker("redis") and not settings.REDIS_URL:
            item.add_marker(pytest.mark.skip(reason="needs Redis (set REDIS_URL)"))


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Production's algorithm at one round. Its hashes carry their round count, so the
    processes a test starts (daphne, qcluster) verify them with the default hasher; the
    default's million rounds cost about half a second per user made or login, which
    summed to minutes of every suite run."""

    iterations = 1


@pytest.fixture(scope="session", autouse=True)
def _quick_password_hashing():
    with override_settings(PASSWORD_HASHERS=["tests.conftest.QuickPBKDF2PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def _no_lingering_connections(django_db_setup, django_db_blocker):
    """Before the test database is dropped: connections kept by threads of finished tests
    (the poller's threads keep theirs on purpose) are freed, so PostgreSQL does not refuse
    the drop with "database is being accessed by other users"."""
    yield
    import gc

    gc.collect()  # a finished thread's connection closes when its wrapper is collected
    if not is_postgres():
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def _no_timed_wake_outlives_its_test():
    # A worker's 429 sets a timed wake for its cool-down's end (dispatch.wake_later): one
    # left over would dispatch into the next test's database.
    yield
    from queue_app.engine import dispatch

    with dispatch._timers_lock:
        pending = [timer for _, timer in dispatch._timers.values()]
        dispatch._timers.clear()
    for timer in pending:
        timer.cancel()


@pytest.fixture(autouse=True)
def _isolated_files(tmp_path, settings):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.DEMO_LEDGER_DIR = tmp_path / "ledger"


@pytest.fixture
def owner(django_user_model):
    return make_user(django_user_model, "owner")


@pytest.fixture
def outsider(django_user_model):
    return make_user(django_user_model, "outsider")


@pytest.fixture
def staff(django_user_model):
    return make_user(django_user_model, "staff", is_staff=True, is_superuser=True)


@pytest.fixture
def provider(owner):
    return make_provider(owner)


@pytest.fixture
def project(owner, provider):
    return make_project(owner, provider)


@pytest.fixture
def fake_comfyui(settings):
    """The ComfyUI fake (tests/fakes/comfyui.py, built from the recordings in
    ../shared/comfyui) on a loopback port the outbound guard is told to allow."""
    from tests.fakes.comfyui import FakeComfyUI

    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    server = FakeComfyUI().start()
    yield server
    server.stop()


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def chromium():
    """Debian's Chromium driven by Playwright (where it is missing, the autouse check above
    skips the test, or fails it under `make test`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class InlineTasks:
    """Captures enqueued django-q2 tasks; `run()` executes them like a worker would."""

    def __init__(self):
        self.queue = []

    def __call__(self, func, *args):
        self.queue.append((func, args))

    def run(self, limit=None):
        from django.utils.module_loading import import_string

        ran = 0
        while self.queue and (limit is None or ran < limit):
            func, args = self.queue.pop(0)
            import_string(func)(*args)
            ran += 1
        return ran

    def executions(self):
        return [args for func, args in self.queue if func.endswith("execute_job")]


@pytest.fixture
def inline_tasks(monkeypatch):
    tasks = InlineTasks()
    monkeypatch.setattr("queue_app.engine.enqueue.enqueue_task", tasks)
    return tasks


def status_of(job) -> str:
    return Job.objects.values_list("status", flat=True).get(id=job.id)


def statuses(jobs) -> list[str]:
    return [status_of(job) for job in jobs]


__all__ = [
    "make_user",
    "make_provider",
    "make_project",
    "make_drafts",
    "make_job",
    "status_of",
    "statuses",
    "Status",
    "is_postgres",
]
