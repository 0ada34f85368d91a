"""One settings module, read from the environment (healthchecks style).

No variable is required: without configuration the app runs on SQLite (WAL, IMMEDIATE
transactions) with django-q2's ORM broker and an in-memory channel layer. Setting
DATABASE_URL and REDIS_URL switches to PostgreSQL and Redis. Every variable is listed in
the README's configuration table and docs/operations.md.
"""

import base64
import hashlib
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from queue_app import limits

BASE_DIR = Path(__file__).resolve().parent.parent


def envbool(name: str, default: str = "False") -> bool:
    return os.getenv(name, default).strip().lower() in ("1", "true", "yes", "on")


def envint(name: str, default: int) -> int:
    return int(os.getenv(name) or default)


def envfloat(name: str, default: float) -> float:
    return float(os.getenv(name) or default)


def envlist(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.getenv(name, default).split(",") if item.strip()]


VAR_DIR = Path(os.getenv("VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Off unless asked for: `make run` asks (DEBUG=True); a deployment that forgets the
# variable serves no tracebacks. With DEBUG off, SECRET_KEY and FIELD_ENCRYPTION_KEY are
# required (below): nothing falls back to a key that is in this file.
DEBUG = envbool("DEBUG", "False")
SECRET_KEY = os.getenv("SECRET_KEY", "")
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")
# Browser origins (besides this host) allowed to call /mcp: the DNS-rebinding guard.
MCP_ALLOWED_ORIGINS = envlist("MCP_ALLOWED_ORIGINS")
# the port `make run` / `manage.py run_stack` listen on; SITE_URL follows it unless set
PORT = envint("PORT", 8000)
SITE_URL = os.getenv("SITE_URL", f"http://127.0.0.1:{PORT}")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_q",
    "axes",
    "queue_app",
    "comfy_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files from the application itself on every server (make run, the tests' daphne,
    # production); a proxy in front may serve STATIC_ROOT instead. Second, as WhiteNoise asks.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A form's one-time token: a double click or a reload after a POST does the work once.
    "queue_app.web.form_once.FormOnceMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with 429.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "remixstudio.urls"
ASGI_APPLICATION = "remixstudio.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# --- Database -------------------------------------------------------------------------

SQLITE_OPTIONS = {
    # IMMEDIATE takes the write lock at BEGIN, so read-then-write transactions from
    # several processes wait for each other instead of failing with "database is locked".
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}

DATABASE_URL = os.getenv("DATABASE_URL", "")
TEST_DB_NAME = os.getenv("TEST_DB_NAME", "")


def database_from_url(url: str) -> dict:
    """DATABASES["default"] for a URL, or the SQLite default for an empty one."""
    if not url:
        url = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
    db = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    if db["ENGINE"] == "django.db.backends.sqlite3":
        db["OPTIONS"] = {**SQLITE_OPTIONS, **db.get("OPTIONS", {})}
        # Several processes share the test database (workers, daphne), so it is a file.
        db["TEST"] = {"NAME": TEST_DB_NAME or str(VAR_DIR / "test_db.sqlite3")}
        # SQLite connections are cheap; persistent ones would keep WAL readers pinned.
        db["CONN_MAX_AGE"] = 0
    else:
        db["OPTIONS"] = {**dead_peer_options(), **db.get("OPTIONS", {})}
        if TEST_DB_NAME:
            db["TEST"] = {"NAME": TEST_DB_NAME}
    return db


# A peer that goes silent (a host cut off by the network, a machine gone) must be given up
# on in seconds at both ends: the server holds a cut-off session's row locks (a provider's
# dispatch lock, a job's claim) until it notices, which by the kernel's keepalive default
# is two hours, stalling every other host; and the cut-off worker's own queries hang for
# minutes of retransmission. Keepalive probes and ACKs are answered by the kernel, so a
# long query on a live link is not affected.
DB_DEAD_PEER_SECONDS = envint("DB_DEAD_PEER_SECONDS", 6)


def dead_peer_options() -> dict:
    idle = max(1, DB_DEAD_PEER_SECONDS // 3)
    count = 3
    interval = max(1, (DB_DEAD_PEER_SECONDS - idle) // count)
    user_timeout_ms = DB_DEAD_PEER_SECONDS * 1000
    server = (
        f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval} "
        f"-c tcp_keepalives_count={count} -c tcp_user_timeout={user_timeout_ms}"
    )
    return dict(
        keepalives=1,
        keepalives_idle=idle,
        keepalives_interval=interval,
        keepalives_count=count,
        tcp_user_timeout=user_timeout_ms,
        connect_timeout=max(2, DB_DEAD_PEER_SECONDS),
        options=server + synchronous_commit_option(),
    )


def synchronous_commit_option() -> str:
    """`off` for a throwaway database (tests): commits stop waiting for the disk (operations.md)."""
    value = os.getenv("DB_SYNCHRONOUS_COMMIT", "").strip().lower()
    if value not in ("", "on", "off", "local", "remote_write", "remote_apply"):
        raise ImproperlyConfigured(f"DB_SYNCHRONOUS_COMMIT={value!r}: use on, off or local")
    return f" -c synchronous_commit={value}" if value else ""


DATABASES = {"default": database_from_url(DATABASE_URL)}
# The hot path's own statements (engine/model_sql.py) are prepared on PostgreSQL; off for a
# pooler that cannot keep prepared statements across transactions.
PREPARE_HOT_STATEMENTS = envbool("PREPARE_HOT_STATEMENTS", "True")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# models.W040: SQLite ignores the INCLUDE columns of a covering index (PostgreSQL's speed-up).
SILENCED_SYSTEM_CHECKS = ["models.W040"]

# --- Redis: broker, channel layer, cache ----------------------------------------------

REDIS_URL = os.getenv("REDIS_URL", "")
HOSTNAME = socket.gethostname()

QUEUE_WORKERS = envint("QUEUE_WORKERS", 4)
Q_CLUSTER = {
    "name": os.getenv("Q_CLUSTER_NAME", "remixstudio"),
    "workers": QUEUE_WORKERS,
    # Our Job and JobAttempt rows are the record; django-q2's result rows cost ~8x
    # throughput (ARCHITECTURE, measured) and tell us nothing new.
    "save_limit": -1,
    "timeout": envint("QUEUE_TASK_TIMEOUT", 900),
    # retry is the broker's visibility timeout: it must exceed any task's run time or
    # the same task is delivered twice (fencing would make that harmless, not free).
    "retry": envint("QUEUE_TASK_TIMEOUT", 900) * 2 + 60,
    "ack_failures": True,
    "max_attempts": 1,
    # Prefetched tasks burn their retry window, so keep the local queue short.
    "queue_limit": QUEUE_WORKERS * 2,
    "catch_up": False,
    "poll": envfloat("QUEUE_ORM_POLL", 0.05),
    "guard_cycle": 0.5,
    "daemonize_workers": False,
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": os.getenv("CHANNELS_PREFIX", "rs")},
        }
    }
else:
    # Enqueue joins the surrounding transaction with the ORM broker on "default", so a
    # claim and the task that runs it commit or roll back together.
    Q_CLUSTER["orm"] = "default"
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Auth, static, media --------------------------------------------------------------

# Failed logins are throttled per account and address (django-axes, database handler:
# every process sees the same count): LOGIN_FAILURE_LIMIT failures of one username from one
# address lock that pair out for LOGIN_LOCKOUT_MINUTES; a success resets the count. Behind
# a proxy, run daphne with --proxy-headers so the address is the client's, not the proxy's.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=envfloat("LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/projects/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Request bodies (remixstudio/edge.py bounds them before Django reads them): form fields in
# memory up to limits.FORM_BYTES, uploaded files spooled to disk past UPLOAD_MEMORY_BYTES,
# room for the monitor's 1000 selected jobs, and a draft's reference images as files.
DATA_UPLOAD_MAX_MEMORY_SIZE = limits.FORM_BYTES
FILE_UPLOAD_MAX_MEMORY_SIZE = limits.UPLOAD_MEMORY_BYTES
DATA_UPLOAD_MAX_NUMBER_FIELDS = limits.FORM_FIELDS
DATA_UPLOAD_MAX_NUMBER_FILES = limits.REFERENCES + 1

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.getenv("STATIC_ROOT", VAR_DIR / "static"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise reads it at start (empty until collectstatic)
# WhiteNoise also serves the apps' own static folders (found at start), so a checkout
# serves them without collectstatic; with DEBUG an edited file is served without a restart.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
MEDIA_URL = "/media/"
MEDIA_ROOT = Path(os.getenv("MEDIA_ROOT", VAR_DIR / "media"))
# Below this much free space on the media disk no job is sent to its provider: a result
# that cannot be stored would be paid for again once space returns.
MEDIA_MIN_FREE_BYTES = envint("MEDIA_MIN_FREE_BYTES", 8 * 1024 * 1024)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", "False")
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "False")
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if envbool("BEHIND_PROXY") else None

# --- Secrets at rest ------------------------------------------------------------------


def derive_fernet_key(secret: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(("fernet:" + secret).encode()).digest()).decode()


# Production sets FIELD_ENCRYPTION_KEY (a Fernet key); development derives one from
# SECRET_KEY so the embedded default needs no configuration.
FIELD_ENCRYPTION_KEY = os.getenv("FIELD_ENCRYPTION_KEY", "")


def require_production_secrets() -> None:
    """With DEBUG off, a missing secret stops start-up here, with what to do about it."""

    missing = [name for name, value in (("SECRET_KEY", SECRET_KEY), ("FIELD_ENCRYPTION_KEY", FIELD_ENCRYPTION_KEY)) if not value]
    if missing:
        raise ImproperlyConfigured(
            f"{' and '.join(missing)} must be set when DEBUG is off (production): see the README's Production "
            "section. For development, set DEBUG=True (make run does) and development keys are used."
        )
    try:
        from cryptography.fernet import Fernet

        Fernet(FIELD_ENCRYPTION_KEY.encode())
    except ValueError:
        raise ImproperlyConfigured(
            "FIELD_ENCRYPTION_KEY is not a Fernet key (32 url-safe base64-encoded bytes): "
            'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
        ) from None


# Management commands that only read the code (no request served, nothing encrypted or
# signed) run without production secrets: a migration check in a build step needs no keys.
# They get a random key of their own process, never the public development constant.
CODE_ONLY_COMMANDS = {"makemigrations", "showmigrations", "sqlmigrate", "help", "version"}


def runs_code_only_command(argv) -> bool:
    if len(argv) < 2 or not argv[0].endswith("manage.py"):
        return False
    command = argv[1]
    return command in CODE_ONLY_COMMANDS or (command == "check" and "--deploy" not in argv)


if DEBUG:
    SECRET_KEY = SECRET_KEY or "dev-only-not-secret-" + "remixstudio" * 4
    FIELD_ENCRYPTION_KEY = FIELD_ENCRYPTION_KEY or derive_fernet_key(SECRET_KEY)
elif runs_code_only_command(sys.argv) and not (SECRET_KEY and FIELD_ENCRYPTION_KEY):
    SECRET_KEY = SECRET_KEY or base64.urlsafe_b64encode(os.urandom(48)).decode()
    FIELD_ENCRYPTION_KEY = FIELD_ENCRYPTION_KEY or derive_fernet_key(SECRET_KEY)
else:
    require_production_secrets()

# --- The queue ------------------------------------------------------------------------

LEASE_TTL_SECONDS = envfloat("LEASE_TTL_SECONDS", 10)
LEASE_RENEW_SECONDS = envfloat("LEASE_RENEW_SECONDS", 3)
CLAIM_TTL_SECONDS = envfloat("CLAIM_TTL_SECONDS", 30)
HEAL_INTERVAL_SECONDS = envfloat("HEAL_INTERVAL_SECONDS", 2)
# Dead owners (a killed worker or cluster, known by the kernel here or by missed
# heartbeats elsewhere) are looked for more often than the full heal: their slots are idle
# until then. One DISTINCT over running jobs' lease owners per pass.
DEAD_OWNER_SECONDS = envfloat("DEAD_OWNER_SECONDS", 0.5)
DISPATCH_SAFETY_NET_SECONDS = envfloat("DISPATCH_SAFETY_NET_SECONDS", 3)
HEARTBEAT_SECONDS = envfloat("HEARTBEAT_SECONDS", 5)
BACKOFF_BASE_SECONDS = envfloat("BACKOFF_BASE_SECONDS", 2)
BACKOFF_CAP_SECONDS = envfloat("BACKOFF_CAP_SECONDS", 60)
DEFAULT_MAX_ATTEMPTS = envint("DEFAULT_MAX_ATTEMPTS", 4)
JOB_PROCESSING_TIMEOUT_MS = envint("JOB_PROCESSING_TIMEOUT_MS", 7_200_000)
DETACHED_POLL_SECONDS = envfloat("DETACHED_POLL_SECONDS", 30)
POLL_PARALLELISM = envint("POLL_PARALLELISM", 16)
JOB_STORAGE_ESTIMATE_BYTES = 25 * 1024 * 1024
DEFAULT_STORAGE_LIMIT_BYTES = 5 * 1024**3
# Outbound HTTP: hosts (or host:port) exempt from the private-address guard, and whether
# plain http is allowed. Tests use these for their loopback fakes.
OUTBOUND_ALLOWLIST = envlist("OUTBOUND_ALLOWLIST")
OUTBOUND_ALLOW_HTTP = envbool("OUTBOUND_ALLOW_HTTP", "False")
OUTBOUND_MAX_BYTES = envint("OUTBOUND_MAX_BYTES", 200 * 1024 * 1024)
# Web Push (finish notifications). Without keys in the environment a pair is generated once
# and stored (the private key encrypted). The subject is the contact push services may use.
VAPID_PUBLIC_KEY = os.getenv("VAPID_PUBLIC_KEY", "")
VAPID_PRIVATE_KEY = os.getenv("VAPID_PRIVATE_KEY", "")
VAPID_SUBJECT = os.getenv("VAPID_SUBJECT") or (SITE_URL if SITE_URL.startswith("https://") else "mailto:admin@localhost")
# A project counts as finished after nothing was pending or processing for this long.
PUSH_SETTLE_SECONDS = envfloat("PUSH_SETTLE_SECONDS", 5)
# Demo provider's record of its own calls, readable by any process (tests, benchmarks).
DEMO_LEDGER_DIR = Path(os.getenv("DEMO_LEDGER_DIR", VAR_DIR / "demo-ledger"))
# Live events: how often daphne relays event rows written by other processes (the only
# path in the embedded default; a safety net behind Redis). 0 turns the relay off.
LIVE_RELAY_SECONDS = envfloat("LIVE_RELAY_SECONDS", 1.0 if REDIS_URL else 0.1)
# ComfyUI: the runner also listens on each instance's WebSocket to notice finished prompts
# at once (polling every 2 s stays the source of truth); downloads give up after this
# long without data, or this long in all.
COMFY_WEBSOCKET = envbool("COMFY_WEBSOCKET", "True")
COMFY_DOWNLOAD_IDLE_SECONDS = envfloat("COMFY_DOWNLOAD_IDLE_SECONDS", 60)
COMFY_DOWNLOAD_TOTAL_SECONDS = envfloat("COMFY_DOWNLOAD_TOTAL_SECONDS", 1800)
# Named failpoints: the process exits at the named point (chaos tests).
FAILPOINTS = envlist("FAILPOINTS")
# Operator's view: the bearer token Prometheus scrapes /metrics with (unset: staff
# sessions only), and the thresholds the monitor and the metrics raise alerts at.
METRICS_TOKEN = os.getenv("METRICS_TOKEN", "")
ALERT_WAIT_SECONDS = envfloat("ALERT_WAIT_SECONDS", 600)
ALERT_FAILURE_RATE = envfloat("ALERT_FAILURE_RATE", 0.5)
ALERT_MIN_ATTEMPTS = envint("ALERT_MIN_ATTEMPTS", 5)
# The monitor's charts (attempt log) are recomputed at most this often per user and range.
HISTORY_CACHE_SECONDS = envfloat("HISTORY_CACHE_SECONDS", 10)
# Retention and roll-ups (docs/operations.md): attempts (0 keeps them), live events, and
# how far behind now the roll-up of the attempt log stops.
ATTEMPT_RETENTION_DAYS = envfloat("ATTEMPT_RETENTION_DAYS", 30)
EVENT_RETENTION_HOURS = envfloat("EVENT_RETENTION_HOURS", 24)
ROLLUP_MARGIN_SECONDS = envfloat("ROLLUP_MARGIN_SECONDS", 600)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Logs carry ids, states and reasons: the formatter cuts URLs to their host.
    "formatters": {
        "plain": {
            "()": "queue_app.providers.crypto.RedactingFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
    "loggers": {"django_q": {"level": os.getenv("Q_LOG_LEVEL", "WARNING")}},
}
