"""The settings' fields: each IDEMOPS_<NAME> variable with its type, unit, default, bounds and
one-line description, the checks across fields, and the table of renamed variables.

May import: pydantic, pydantic-settings and dj_database_url only (Django's settings are built
from this, so it cannot use them).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import dj_database_url
from pydantic import AfterValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError, PydanticUndefined
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "IDEMOPS_"
BASE_DIR = Path(__file__).resolve().parents[2]  # the repository: tools_app/conf/fields.py
# Local state (the generated secret key, the embedded database, the demo credentials): var/ beside
# manage.py in a checkout; for an installed platform, var/ in the directory it was started from.
DEFAULT_VAR_DIR = BASE_DIR / "var" if (BASE_DIR / "manage.py").exists() else Path.cwd() / "var"

# Old environment variables and the ones that replaced them. Setting an old one stops
# start-up: a renamed variable silently ignored would run production on a default.
RENAMED = {
    "DJANGO_SECRET_KEY": "IDEMOPS_SECRET_KEY",
    "DJANGO_SECRET_KEY_FALLBACKS": "IDEMOPS_SECRET_KEY_FALLBACKS",
    "DJANGO_DEBUG": "IDEMOPS_DEBUG",
    "DJANGO_ALLOWED_HOSTS": "IDEMOPS_ALLOWED_HOSTS",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "IDEMOPS_CSRF_TRUSTED_ORIGINS",
    "DJANGO_STATIC_ROOT": "IDEMOPS_STATIC_ROOT",
    "LOG_LEVEL": "IDEMOPS_LOG_LEVEL",
    "WEB_WORKERS": "IDEMOPS_WEB_WORKERS",
    "DB_CONN_MAX_AGE": "IDEMOPS_DB_CONN_MAX_AGE_SECONDS",
    "DB_SERVER_SIDE_BINDING": "IDEMOPS_DB_SERVER_SIDE_BINDING",
    "DB_PREPARE_THRESHOLD": "IDEMOPS_DB_PREPARE_THRESHOLD",
    "Q_WORKERS": "IDEMOPS_Q_WORKERS",
    "Q_TIMEOUT": "IDEMOPS_Q_TIMEOUT_SECONDS",
    "Q_EXPECTED_QUEUE_WAIT": "IDEMOPS_Q_EXPECTED_QUEUE_WAIT_SECONDS",
    "MCP_ALLOWED_HOSTS": "IDEMOPS_MCP_ALLOWED_HOSTS",
    "MCP_ALLOWED_ORIGINS": "IDEMOPS_MCP_ALLOWED_ORIGINS",
    "MCP_DB_THREADS": "IDEMOPS_MCP_DB_THREADS",
    "MCP_MAX_REQUEST_BYTES": "IDEMOPS_MCP_MAX_REQUEST_BYTES",
    "NOTIFICATION_WEBHOOK_ALLOWED_PREFIXES": "IDEMOPS_WEBHOOK_ALLOWED_PREFIXES",
    "NOTIFICATION_WEBHOOK_TIMEOUT_SECONDS": "IDEMOPS_WEBHOOK_TIMEOUT_SECONDS",
    "EMAIL_HOST": "IDEMOPS_EMAIL_HOST",
    "EMAIL_PORT": "IDEMOPS_EMAIL_PORT",
    "EMAIL_HOST_USER": "IDEMOPS_EMAIL_HOST_USER",
    "EMAIL_HOST_PASSWORD": "IDEMOPS_EMAIL_HOST_PASSWORD",
    "EMAIL_USE_TLS": "IDEMOPS_EMAIL_USE_TLS",
    "EMAIL_TIMEOUT": "IDEMOPS_EMAIL_TIMEOUT_SECONDS",
    "DEFAULT_FROM_EMAIL": "IDEMOPS_DEFAULT_FROM_EMAIL",
}

# What the demo app imports beyond the platform (the `demo` extra): whether they are there decides
# IDEMOPS_DEMO's default.
DEMO_DEPENDENCIES = ("pgvector", "wordllama", "pypdf")


def missing_demo_dependencies() -> list[str]:
    return [name for name in DEMO_DEPENDENCIES if importlib.util.find_spec(name) is None]


def demo_installed() -> bool:
    return not missing_demo_dependencies()


CrashPoint = Literal["after_claim", "after_downstream", "after_commit", "after_checkpoint", "after_batch",
                     "in_compensation"]


def check_http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PydanticCustomError("http_url", "not an http:// or https:// URL with a host")
    return value


def check_postgres_url(value: str) -> str:
    try:
        engine = dj_database_url.parse(value)["ENGINE"]
    except Exception:  # dj_database_url raises several kinds for a URL it cannot read
        engine = None
    if engine != "django.db.backends.postgresql":
        raise PydanticCustomError("postgres_url", "idemops runs on PostgreSQL only")
    return value


def check_network(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise PydanticCustomError("network", "not an IP network such as 10.0.0.0/8 or ::1/128") from None


HttpUrl = Annotated[str, AfterValidator(check_http_url)]
PostgresUrl = Annotated[str, AfterValidator(check_postgres_url)]
Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[float, Field(gt=0)]
TextList = Annotated[list[str], NoDecode]
UrlList = Annotated[list[HttpUrl], NoDecode]


def setting(default: Any = PydanticUndefined, doc: str = "", *, shown: str | None = None, section: str = "",
            **field: Any) -> Any:
    """A field with its one-line description, its section in docs/settings.md and, where the
    default is computed, how the doc shows it. An app's settings (AppSettings) need no section: the
    doc lists them under the app's title."""
    return Field(default, description=doc, json_schema_extra={"section": section, "shown": shown}, **field)


(WEB, OBSERVABILITY, TRACES, SECRETS, DATABASE, JOBS, MCP, OAUTH, LIMITS, WRITES, RECONCILE, DOWNSTREAM, EMAIL,
 OUTBOX, TASKS, CONSOLE, RETENTION, AUDIT, TESTING) = (
    "Web and processes", "Logs and metrics", "Traces (OpenTelemetry's own variables)", "Secrets", "Database",
    "Job cluster (django-q2)", "MCP endpoint", "Agents' OAuth (docs/auth.md)", "Per-tenant limits",
    "Writes, leases and outages", "Reconciliation of unknown outcomes", "Downstream systems",
    "Email", "Outbox relay", "Long tasks", "Operators' console", "Retention and purge",
    "Audit log (docs/audit-log.md)", "Testing")


class EnvironmentSettings(BaseSettings):
    """Settings read from IDEMOPS_<NAME> variables: the platform's (IdemopsSettings) and each app's
    (idemops.conf.AppSettings), with the same rules for lists, empty values and frozen objects."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, frozen=True, extra="forbid", validate_by_name=True,
                                      validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _from_environment(cls, value: Any, info: ValidationInfo) -> Any:
        """Comma-separated lists; an empty optional value is unset; log levels in any case."""
        if not isinstance(value, str):
            return value
        assert info.field_name is not None, "a field validator always validates a field"
        field = cls.model_fields[info.field_name]
        if NoDecode in field.metadata:
            return [item.strip() for item in value.split(",") if item.strip()]
        if value == "" and types.NoneType in typing.get_args(field.annotation):
            return None
        if info.field_name == "log_level":
            return value.upper()
        return value


class IdemopsSettings(EnvironmentSettings):
    """Every idemops setting, each from IDEMOPS_<NAME> (DATABASE_URL excepted)."""

    # --- web and processes ---
    # Declared first: the defaults below that depend on it (demo) read it.
    env: Literal["development", "production"] = setting(
        "development", "`production` refuses to start (naming each variable) without DATABASE_URL and "
        "IDEMOPS_SECRET_KEY, with IDEMOPS_DEBUG or IDEMOPS_DEMO on, an http:// IDEMOPS_PUBLIC_URL or the "
        "development IDEMOPS_ALLOWED_HOSTS; and it turns on HSTS, HTTPS redirects and secure cookies "
        "(docs/deploy.md).", section=WEB)
    demo: bool = setting(
        default_factory=lambda data: data.get("env", "development") != "production" and demo_installed(),
        doc="The demo app (`idemops_demo`: its tools, tables and console pages); `manage.py serve` creates the "
        "demo tenant, its people and its agent token, and starts the demo downstream systems (the demo's "
        "own settings, docs/settings.md). Off: no demo tool is listed and no demo table is made. On by default "
        "only where the demo's dependencies are installed (`make run`, `pip install 'idemops[demo]'`): an "
        "adopter who never asked for it never meets it; on without them, start-up refuses, naming them. "
        "Production refuses it on.",
        shown="on where the `demo` extra is installed; off otherwise, and when IDEMOPS_ENV=production",
        section=WEB)
    behind_proxy: bool = setting(
        False, "A TLS-terminating proxy stands in front and sets `X-Forwarded-Proto` (replacing any the client "
        "sent): a request it marks `https` is secure (Django's SECURE_PROXY_SSL_HEADER).", section=WEB)
    public_url: HttpUrl = setting(
        "http://127.0.0.1:8000", "The URL clients reach this server at: printed by `make run`, the MCP "
        "resource URL, and the base of the links in approvers' messages.", section=WEB)
    host: str = setting("127.0.0.1", "Interface `manage.py serve` binds the web server to.", section=WEB)
    port: Port = setting(8000, "Port `manage.py serve` binds the web server to.", section=WEB)
    web_workers: int = setting(1, "Web worker processes (granian) `manage.py serve` starts.", ge=1, section=WEB)
    # `serve` restarts a process that dies (with backoff); one that dies this often is broken, not unlucky.
    serve_restart_limit: int = setting(
        5, "Deaths of one process within IDEMOPS_SERVE_RESTART_WINDOW_SECONDS after which `manage.py serve` "
        "stops everything instead of restarting it again.", ge=1, section=WEB)
    serve_restart_window_seconds: Seconds = setting(
        60, "The window IDEMOPS_SERVE_RESTART_LIMIT counts a process's deaths in.", section=WEB)
    allowed_hosts: TextList = setting(
        ["localhost", "127.0.0.1", "[::1]"], "Host names Django serves (its ALLOWED_HOSTS).", section=WEB)
    csrf_trusted_origins: TextList = setting(
        ["http://localhost:8000", "http://127.0.0.1:8000"], "Origins trusted for the admin's unsafe requests "
        "(Django's CSRF_TRUSTED_ORIGINS).", section=WEB)
    debug: bool = setting(False, "Django's DEBUG: tracebacks in error pages. Never in production.", section=WEB)
    static_root: Path | None = setting(
        None, "Where `manage.py collectstatic` writes static files; unset, they are served from the apps.",
        section=WEB)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = setting(
        "INFO", "Level of the root logger (case-insensitive).", section=WEB)
    tool_modules: TextList = setting(
        [], "Modules that declare tools with the public tool API (`idemops.tools`), imported at start-up "
        "besides every installed app's `idemops_tools` module; comma-separated dotted names.", section=WEB)
    extra_apps: TextList = setting(
        [], "Django apps to install besides the platform (an adopter's app that declares tools, models or "
        "admin pages); comma-separated dotted names.", section=WEB)
    var_dir: Path = setting(
        DEFAULT_VAR_DIR, "Where local state lives: the generated secret key, the embedded database, the demo "
        "credentials.", shown="a checkout's `var/`; installed, `var/` in the current directory",
        section=WEB)

    # --- logs and metrics ---
    log_format: Literal["auto", "json", "console"] = setting(
        "auto", "Log lines as JSON (one object a line) or as text for a person; `auto` writes text to a "
        "terminal and JSON anywhere else.", section=OBSERVABILITY)
    access_log: bool = setting(
        True, "`manage.py serve` logs one line per HTTP request (method, path without its query, status).",
        section=OBSERVABILITY)
    metrics_token: SecretStr | None = setting(
        None, "Bearer token a scraper of `/metrics` may present (`Authorization: Bearer ...`); unset, only the "
        "allowed networks may scrape.", section=OBSERVABILITY)
    metrics_allowed_networks: Annotated[list[Annotated[str, AfterValidator(check_network)]], NoDecode] = setting(
        ["127.0.0.1/32", "::1/128"], "Client addresses (CIDR networks) that may scrape `/metrics` without the "
        "token; empty: only the token.", section=OBSERVABILITY)
    metrics_retention_days: int = setting(
        35, "How long the per-minute call figures are kept (the dashboard's and `/metrics`' totals are kept "
        "for ever).", ge=8, section=OBSERVABILITY)

    # --- traces: OpenTelemetry's standard variables, the ones idemops itself acts on (the SDK reads
    # the others, e.g. OTEL_EXPORTER_OTLP_HEADERS, itself) ---
    otel_sdk_disabled: bool = setting(
        False, "No tracing at all: no spans, and no trace ids on records, tasks or log lines.",
        validation_alias="OTEL_SDK_DISABLED", section=TRACES)
    # Spans cost CPU on every call (one per SQL statement through psycopg's instrumentation): a ratio
    # below 1 records only that share of the traces that start here. The trace id is generated and
    # stored either way.
    otel_traces_sampler_arg: float = setting(
        1.0, "Share of the traces started here whose spans are recorded (parent-based: a call whose caller's "
        "`traceparent` is sampled is always recorded, one whose caller's is not never is). With no exporter "
        "(`OTEL_TRACES_EXPORTER`) no span is recorded at all. Trace ids are kept on rows and log lines either way.",
        ge=0, le=1, validation_alias="OTEL_TRACES_SAMPLER_ARG", section=TRACES)
    otel_service_name: str = setting(
        "idemops", "`service.name` of the spans.", validation_alias="OTEL_SERVICE_NAME", section=TRACES)
    otel_traces_exporter: Annotated[list[Literal["otlp", "console", "none"]], NoDecode] | None = setting(
        None, "Where spans go: `otlp`, `console` (standard output), `none`; comma-separated.",
        shown="`otlp` if an OTLP endpoint is set, else `none`", validation_alias="OTEL_TRACES_EXPORTER",
        section=TRACES)
    otel_exporter_otlp_endpoint: HttpUrl | None = setting(
        None, "The OpenTelemetry collector's OTLP/HTTP base URL, e.g. `http://collector:4318` (spans go to "
        "`/v1/traces` under it).", validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT", section=TRACES)
    otel_exporter_otlp_traces_endpoint: HttpUrl | None = setting(
        None, "The full URL spans are posted to, instead of the above.",
        validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", section=TRACES)
    otel_exporter_otlp_protocol: Literal["http/protobuf"] = setting(
        "http/protobuf", "OTLP's transport: idemops exports over HTTP (protobuf) only.",
        validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL", section=TRACES)
    otel_exporter_otlp_traces_protocol: Literal["http/protobuf"] | None = setting(
        None, "The same, for traces only.", validation_alias="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", section=TRACES)

    # --- secrets ---
    secret_key: SecretStr | None = setting(
        None, "Django's SECRET_KEY (sessions, sealed task arguments, derived secrets); the same on every "
        "process.", shown="generated once into `<var dir>/secret_key`", section=SECRETS)
    secret_key_fallbacks: Annotated[list[SecretStr], NoDecode] = setting(
        [], "Old secret keys during a rotation: what they signed or sealed still opens.", section=SECRETS)
    key_digest_secret: SecretStr | None = setting(
        None, "Key of the HMAC-SHA256 digests that stand for idempotency keys outside the database (admin, "
        "API, logs), of the operation ids derived from them, and that purged records keep instead of the key; "
        "the same on every process, and changing it changes every digest shown, the ids of operations claimed "
        "from then on, and makes purged keys unrecognisable (a held one would run as new).",
        shown="derived from the secret key", section=SECRETS)

    kek: SecretStr | None = setting(
        None, "The key-encryption key that wraps the data keys of personal values (32 random bytes, base64; "
        "docs/deploy.md#personal-values-keys): the same on every process, kept apart from the database and its "
        "backups. Production refuses to start without it (or IDEMOPS_KEK_FILE).",
        shown="development: made once and kept in the key store", section=SECRETS)
    kek_file: Path | None = setting(
        None, "A file holding IDEMOPS_KEK (a mounted secret), read at start instead of the variable.",
        section=SECRETS)
    kek_previous: Annotated[list[SecretStr], NoDecode] = setting(
        [], "Former key-encryption keys during a rotation (comma-separated): data keys they wrapped still open "
        "until `manage.py rotate_kek` has wrapped them all again under IDEMOPS_KEK.", section=SECRETS)

    # --- database ---
    database_url: PostgresUrl | None = setting(
        None, "The PostgreSQL server (`postgres://…`); unset, idemops starts an embedded one. Unprefixed: "
        "the universal convention.", validation_alias="DATABASE_URL", section=DATABASE)
    pgdata: Path = setting(
        default_factory=lambda data: data.get("var_dir", DEFAULT_VAR_DIR) / "pg",
        doc="Data directory of the embedded PostgreSQL server (when DATABASE_URL is unset).",
        shown="`<var dir>/pg`", section=DATABASE)
    # Reads that decide nothing (exports, list pages, trends) may go to a standby; everything that
    # decides reads the primary (tools_app/core/replicas.py names which is which, at each call site).
    database_replica_urls: Annotated[list[PostgresUrl], NoDecode] = setting(
        [], "Streaming replicas of DATABASE_URL (comma-separated `postgres://…`): the auditors' API reads and "
        "CSV exports, the console's evidence lists and its dashboard read from one of them; claims, "
        "transitions, operators' queues and every read before an action stay on the primary.", section=DATABASE)
    keystore_url: PostgresUrl | None = setting(
        None, "The key store's PostgreSQL database (the data keys of personal values, wrapped), apart from "
        "DATABASE_URL's: a dump of the main database alone reveals no personal value. Production refuses to start "
        "without it.", shown="a second database `<name>_keys` on DATABASE_URL's server", section=DATABASE)
    database_replica_max_lag_seconds: Seconds = setting(
        5, "A replica whose replay is further behind the primary than this is skipped (its reads go to the "
        "primary) until it catches up; an unreachable replica is skipped too.", section=DATABASE)
    database_listen_url: PostgresUrl | None = setting(
        None, "A direct connection (not through a pooler in transaction mode) for what needs a session: each web "
        "process's LISTEN for task changes.", shown="DATABASE_URL", section=DATABASE)
    embedded_database: bool = setting(
        False, "Set by idemops for the processes it starts: their DATABASE_URL is the embedded server's "
        "(`make run` stops that server on exit). Not set by hand.", section=DATABASE)
    # Persistent connections: with Django's default of 0 the django-q2 cluster measured ~8x
    # slower on a 2-core machine.
    db_conn_max_age_seconds: int = setting(
        600, "How long a database connection is kept and reused (health-checked before reuse); 0 closes it "
        "after each request.", ge=0, section=DATABASE)
    # Measured against persistent connections in bench/bench_pool.py; docs/deploy.md says when to use which.
    db_pool_max_size: int = setting(
        0, "Connections of one process's pool (Django's psycopg pool): its threads share them, each taking one "
        "for a request or job and giving it back after. 0: no pool, each thread keeps its own connection "
        "(IDEMOPS_DB_CONN_MAX_AGE_SECONDS, which a pool replaces).", ge=0, section=DATABASE)
    # Server-side binding lets psycopg prepare the statements we repeat (the engine's claim is
    # one large statement: planning it each time would cost more than running it).
    db_server_side_binding: bool = setting(
        True, "psycopg binds parameters on the server, so repeated statements can be prepared.",
        section=DATABASE)
    db_prepare_threshold: int = setting(
        5, "Executions of a statement before psycopg prepares it (0: at once).", ge=0, section=DATABASE)
    # Streamed reads (CSV exports, the audit chain's verification) use server-side cursors; in
    # autocommit they are WITH HOLD, alive in the session, which a pooler in transaction mode does
    # not keep between statements (docs/deploy.md).
    db_disable_server_side_cursors: bool = setting(
        False, "Read streamed results (CSV exports, audit verification) without server-side cursors: set it "
        "behind a pooler in transaction mode (PgBouncer); each result is then fetched whole.", section=DATABASE)

    # --- django-q2 ---
    # Our own leases decide who runs what; django-q2 only delivers. It must not deliver a
    # running job twice: its `retry` (timeout + expected queue wait) exceeds `timeout`.
    q_workers: int = setting(2, "Worker processes of each `manage.py qcluster`.", ge=1, section=JOBS)
    q_clusters: int = setting(1, "django-q2 clusters (`manage.py qcluster` processes) `manage.py serve` starts.",
                              ge=1, section=JOBS)
    q_timeout_seconds: int = setting(
        600, "django-q2 kills a job running longer than this.", gt=0, section=JOBS)
    q_expected_queue_wait_seconds: int = setting(
        120, "Longest a queued job is expected to wait for a worker; django-q2 redelivers an "
        "unacknowledged job after timeout + this.", gt=0, section=JOBS)

    # --- MCP ---
    # The SDK's DNS-rebinding protection stays on: it answers 421 to other Host headers.
    mcp_allowed_hosts: TextList = setting(
        ["localhost:*", "127.0.0.1:*", "[::1]:*", "localhost", "127.0.0.1"],
        "Host headers /mcp accepts (`host:*` allows any port).", section=MCP)
    mcp_allowed_origins: TextList = setting(
        ["http://localhost:*", "http://127.0.0.1:*"], "Origin headers /mcp accepts.", section=MCP)
    mcp_db_threads: int = setting(
        16, "Threads one web process uses for the database work of MCP calls.", ge=1, section=MCP)
    # A verified token is kept this long in each web process, so most calls verify it without a
    # query and without the hop to a database thread. Revoking clears it in the revoking process
    # at once; other processes refuse the token at most this long after.
    token_cache_seconds: float = setting(
        2, "How long a web process trusts a bearer token it verified before reading it again; a revoked "
        "token is refused by every process at most this long after the revocation (0: read every call).",
        ge=0, section=MCP)
    mcp_max_request_bytes: int = setting(
        32 * 1024 * 1024, "Largest /mcp request body (a tool may take a whole file inline).", gt=0,
        section=MCP)
    mcp_user_confirmation: bool = setting(
        True, "A call through /mcp of a tool that declares a confirmation rule asks the person behind the agent "
        "first, through their MCP host (docs/approvals.md); off: such tools run without asking (for unattended "
        "agents only).", section=MCP)

    # --- agents' OAuth ---
    oauth_access_token_seconds: int = setting(
        3600, "How long an OAuth access token for /mcp lives; the client refreshes it (the refresh token rotates).",
        ge=60, section=OAUTH)
    oauth_refresh_token_days: float = setting(
        30, "How long an unused OAuth refresh token stays good.", gt=0, section=OAUTH)
    oauth_dynamic_registration: bool = setting(
        True, "Whether MCP hosts may register themselves as OAuth clients (RFC 7591 dynamic client registration).",
        section=OAUTH)
    oauth_registrations_per_hour: int = setting(
        20, "Dynamic client registrations accepted from one address per hour (more are refused).", ge=1,
        section=OAUTH)
    oauth_client_metadata_documents: bool = setting(
        True, "Whether a client may be an https URL naming its metadata document (Client ID Metadata Documents), "
        "fetched through IDEMOPS_OAUTH_CLIENT_METADATA_ALLOWED_PREFIXES.", section=OAUTH)
    oauth_client_metadata_allowed_prefixes: UrlList = setting(
        [], "URL prefixes a client's metadata document may be fetched from, through the outbound allow-list "
        "(empty: none, so such clients are refused; a private or loopback address is refused unless the prefix "
        "names that IP address).", section=OAUTH)

    # --- per-tenant limits (defaults; each tenant's own are edited in the admin) ---
    rate_limit_calls_per_minute: int = setting(
        0, "Tool calls per minute one tenant may make, all its tokens together (a minute's worth may come at "
        "once); over it, calls answer rate_limited with retry_after. 0: no limit.", ge=0, section=LIMITS)
    rate_limit_calls_per_minute_per_token: int = setting(
        0, "Tool calls per minute one API token may make. 0: no limit.", ge=0, section=LIMITS)
    max_concurrent_tasks_per_agent: int = setting(
        20, "Long tasks one agent (a token's identity) may have unfinished at once; one more is refused "
        "rate_limited. 0: no limit.", ge=0, section=LIMITS)

    # --- writes, leases and outages ---
    # After a crash, a key settles within the lease plus the sweep period.
    execution_lease_seconds: Seconds = setting(
        10, "How long an executor holds a key before a caller or the sweep may take it for dead "
        "(PROCESSING -> UNKNOWN).", section=WRITES)
    execution_heartbeat_seconds: Seconds = setting(
        2, "How often the executor renews its lease while the handler runs (at most a third of the lease "
        "is used); less than the lease.", section=WRITES)
    lease_sweep_seconds: float = setting(
        1, "How often each django-q2 worker process sweeps expired leases and runs due reconciliations; "
        "0 leaves them to the 1-minute schedule.", ge=0, section=WRITES)
    max_attempts_per_key: int = setting(
        10, "Runs of one key whose outcome was uncertain or unexpected (a timeout after sending, an internal "
        "error, a lost lease, each later found not done) before it goes to the operators' UNKNOWN queue, "
        "flagged 'needs a person', instead of running again. Runs the downstream refused before acting "
        "(503 or 429 with nothing done, connection refused) are not counted: IDEMOPS_RETRY_WINDOW_SECONDS "
        "bounds those.", ge=1, section=WRITES)
    retry_window_seconds: Seconds = setting(
        900, "How long a key whose runs the downstream refused before acting (a known non-execution) may be "
        "run again, from its first refused run; past it the record is FAILED for good, class not_executed "
        "(nothing was done; a new operation needs a new key). A tool may declare its own (retry_window).",
        section=WRITES)
    follower_wait_seconds: float = setting(
        2, "How long a second call with a running key waits before answering in_progress.", ge=0,
        section=WRITES)
    schedule_tick_seconds: float = setting(
        1, "How often each django-q2 worker process runs the scheduled operations whose tick came due "
        "(tools_app.scheduling); 0 leaves them to the 1-minute schedule.", ge=0, section=JOBS)
    concurrency_wait_seconds: float = setting(
        5, "How long a write whose tool declares a concurrency key waits while another operation on the same "
        "business entity runs, before answering in_progress (nothing done; ask again with the same key).", ge=0,
        section=WRITES)
    wait_poll_seconds: Seconds = setting(
        0.1, "How often a web process asks the database, in one query, about every row its waiting calls "
        "(followers, task waits) wait on.", section=WRITES)
    in_progress_retry_after_seconds: Seconds = setting(
        2, "retry_after of an in_progress answer.", section=WRITES)
    unavailable_retry_after_seconds: Seconds = setting(
        2, "Retry-After of the 503 and transient answers while the database is unreachable.", section=WRITES)
    operation_id_ttl_seconds: Seconds = setting(
        3600, "How long an operation id issued by prepare_operation stays valid for its first call (and "
        "prepare_operation with the same key answers the same id).", section=WRITES)

    # --- reconciliation ---
    reconcile_backoff_seconds: Seconds = setting(
        10, "Base of the backoff between reconciliation attempts (doubles each attempt).", section=RECONCILE)
    reconcile_max_attempts: int = setting(
        6, "Attempts before a person is asked to settle an unknown outcome.", ge=1, section=RECONCILE)
    reconcile_turn_seconds: Seconds = setting(
        60, "How long one reconciler keeps its turn on a record.", section=RECONCILE)

    # --- downstream systems ---
    breaker_failures: int = setting(
        5, "Definite failures or timeouts of one downstream system (503/429, connection refused, a timeout) "
        "within IDEMOPS_BREAKER_WINDOW_SECONDS that open its circuit breaker: its tools then answer transient "
        "without running until a probe succeeds. 0: no breaker.", ge=0, section=DOWNSTREAM)
    breaker_window_seconds: Seconds = setting(
        30, "The window the breaker counts a downstream's failures in.", section=DOWNSTREAM)
    breaker_open_seconds: Seconds = setting(
        5, "How long an open breaker waits before one call probes the downstream (again after each failed "
        "probe); the retry_after its answers carry.", section=DOWNSTREAM)
    downstream_max_in_flight: int = setting(
        16, "Calls in flight to one downstream system at once, from every process together (leased slots in "
        "PostgreSQL); one more answers transient before anything is sent, and the reconciler's lookups wait "
        "their turn. 0: no limit.", ge=0, section=DOWNSTREAM)
    incident_state_seconds: Seconds = setting(
        1, "How often each process re-reads the pauses and breaker states it checks before a write runs: a "
        "pause or an opened breaker applies everywhere within this time.", section=DOWNSTREAM)
    webhook_allowed_prefixes: UrlList = setting(
        ["http://127.0.0.1:8002/webhooks/"], "URL prefixes a webhook recipient must fall under "
        "(comma-separated).", section=DOWNSTREAM)
    webhook_timeout_seconds: Seconds = setting(5, "Timeout of one webhook delivery.", section=DOWNSTREAM)
    webhook_secret_overlap_seconds: Seconds = setting(
        86400, "After a tenant's webhook signing secret is rotated, how long webhooks are signed with the "
        "previous one too (a second signature), so receivers can switch without rejecting one.", section=DOWNSTREAM)
    outbound_private_hosts: TextList = setting(
        [], "Host names on the URL allow-lists that may resolve to private, loopback or link-local "
        "addresses; any other name must resolve to public ones.", section=DOWNSTREAM)

    # --- email ---
    email_host: str = setting(
        "127.0.0.1", "SMTP server notification email goes through (`make run` starts a sink on 8025).",
        section=EMAIL)
    email_port: Port = setting(8025, "Port of the SMTP server.", section=EMAIL)
    email_host_user: str = setting("", "SMTP user name (empty: no login).", section=EMAIL)
    email_host_password: SecretStr = setting(SecretStr(""), "SMTP password.", shown="empty", section=EMAIL)
    email_use_tls: bool = setting(False, "STARTTLS to the SMTP server.", section=EMAIL)
    email_timeout_seconds: Seconds = setting(10, "Timeout of one SMTP conversation.", section=EMAIL)
    default_from_email: str = setting("idemops@localhost", "Sender of notification email.", section=EMAIL)

    # --- outbox ---
    outbox_batch_size: int = setting(20, "Events one relay run claims.", ge=1, section=OUTBOX)
    outbox_delivery_threads: int = setting(
        8, "Deliveries a relay makes at once (a slow consumer holds up only its own event).", ge=1,
        section=OUTBOX)
    outbox_claim_seconds: Seconds = setting(
        60, "How long a relay's claim on a batch lasts; after it, another relay may deliver the events "
        "(consumers deduplicate). Longer than a delivery's timeout.", section=OUTBOX)
    outbox_max_attempts: int = setting(
        8, "Delivery attempts before an event is dead-lettered.", ge=1, section=OUTBOX)
    outbox_backoff_seconds: Seconds = setting(
        5, "Base of the backoff between delivery attempts (doubles each attempt, with jitter).",
        section=OUTBOX)

    # --- long tasks ---
    # P7 of the performance issue: a killed worker's task resumes within the lease plus the loop's
    # period (IDEMOPS_LEASE_SWEEP_SECONDS) plus the broker's pick-up.
    task_lease_seconds: Seconds = setting(
        10, "A worker's lease on a running task; renewed every heartbeat while a step runs.", section=TASKS)
    task_heartbeat_seconds: Seconds = setting(
        2, "Lease renewal and progress write interval (at most a third of the lease is used); less than "
        "the lease.", section=TASKS)
    task_sweep_minutes: int = setting(
        1, "How often the task sweep runs as a django-q2 schedule (one minute is the shortest).", ge=1,
        section=TASKS)
    # A queued job whose cluster died stays locked for django-q2's `retry` (minutes); the task's own
    # lease says much sooner that no worker has it (tools_app.tasks.state.without_a_job).
    task_requeue_after_seconds: Seconds = setting(
        5, "Grace beyond the task lease: a queued task no worker took within the lease plus this long, and "
        "whose job the queue no longer holds for a worker (it failed, or its cluster died), is queued again "
        "by the sweep.", section=TASKS)
    task_max_lease_expiries: int = setting(
        5, "Worker deaths before the task fails (a step that kills its worker).", ge=1, section=TASKS)
    # Issue 36: a task nobody finishes (a pause nobody answers, a step that hangs) must not hold its
    # key forever; a long tool may declare its own (task_tool's `deadline`).
    task_deadline_seconds: Seconds = setting(
        7 * 24 * 3600, "How long a long task may take from its start to its end, pauses and backoffs included, "
        "when its tool declares no deadline of its own; one not done by then ends, failed (transient) with the "
        "reason. A caller may ask for less (MCP tasks' requested ttl), never more.", section=TASKS)
    task_max_attempts: int = setting(
        5, "Default runs per task for transient failures (pipelines may declare their own).", ge=1,
        section=TASKS)
    task_backoff_base_seconds: Seconds = setting(
        2, "Default backoff base between a task's attempts.", section=TASKS)
    task_backoff_max_seconds: Seconds = setting(
        300, "Default ceiling of that backoff; at least the base.", section=TASKS)
    task_inline_retry_max_seconds: float = setting(
        30, "A backoff up to this long is waited out by the worker; longer ones are left to the sweep.",
        ge=0, section=TASKS)
    task_slice_seconds: float = setting(
        default_factory=lambda data: data.get("q_timeout_seconds", 600) / 2,
        doc="A worker hands a task on to a fresh job at a step boundary after this long, so no job runs "
        "into django-q2's timeout; less than IDEMOPS_Q_TIMEOUT_SECONDS (0: after every step).",
        ge=0, shown="IDEMOPS_Q_TIMEOUT_SECONDS / 2", section=TASKS)
    task_call_wait_seconds: float = setting(
        10, "Calling a long tool directly waits this long for its task before answering in_progress.", ge=0,
        section=TASKS)
    task_max_wait_seconds: Seconds = setting(
        60, "Largest wait_seconds of get_task_status / get_task_result (the tools' schema states it; more is "
        "invalid_input).", section=TASKS)
    task_poll_interval_ms: int = setting(
        1000, "pollIntervalMs the MCP tasks extension suggests.", gt=0, section=TASKS)
    task_watch_poll_seconds: Seconds = setting(
        5, "A client waiting on a task's changes (tasks/result, a task subscription) is woken by the task's "
        "change notice; it also re-reads the task at least this often, in case a notice was missed.",
        section=TASKS)
    task_listen_max_seconds: Seconds = setting(
        3600, "A subscriptions/listen stream for tasks ends (gracefully) after this long; the client listens "
        "again if it still cares.", section=TASKS)


    # --- retention ---
    retention_records_hours: float = setting(
        24 * 30, "How long a finished idempotency record keeps its arguments and result, counted from its "
        "finish (never less than its key's retention: a replay needs them). Tools and tenants may override it.",
        gt=0, section=RETENTION)
    retention_tasks_hours: float = setting(
        24 * 30, "How long a finished task keeps its arguments, result and answers, counted from its finish.",
        gt=0, section=RETENTION)
    retention_artifacts_hours: float = setting(
        24 * 7, "How long a finished task keeps its checkpoints and artifacts (step outputs), from its finish.",
        gt=0, section=RETENTION)
    retention_purge_minutes: int = setting(
        60, "How often the purge job runs as a django-q2 schedule.", ge=1, section=RETENTION)
    retention_purge_batch: int = setting(
        500, "Rows the purge job takes per transaction (SELECT ... FOR UPDATE SKIP LOCKED).", ge=1, le=100_000,
        section=RETENTION)

    # --- audit log ---
    audit_verify_checkpoint_events: int = setting(
        100_000, "`verify_audit_log` stores a checkpoint (seq and hash) after each range of this many events it "
        "found sound; a verification that stops resumes after the newest checkpoint.", ge=1, le=10_000_000,
        section=AUDIT)
    # Bounds one request's work: about a second at the verification rate docs/benchmarks.md measures.
    audit_verify_page_events: int = setting(
        20_000, "Most events the auditors' API checks in one `audit-chain/verify` request; the answer's `next` "
        "cursor continues from there.", ge=1, le=1_000_000, section=AUDIT)

    audit_retention_days: int = setting(
        0, "Days an audit event is kept from its creation, for tenants without their own audit retention (and "
        "events of no tenant); 0: for ever. The purge job archives expired events to files "
        "(docs/audit-log.md).", ge=0, section=AUDIT)
    audit_partition_months_ahead: int = setting(
        3, "Months after this one whose audit partitions the daily job `audit.partitions` keeps created ahead "
        "(the audit table is partitioned by month; docs/audit-log.md).", ge=1, le=120, section=AUDIT)
    audit_archive_dir: Path = setting(
        default_factory=lambda data: data.get("var_dir", DEFAULT_VAR_DIR) / "audit-archive",
        doc="Where the purge job writes archived audit events (one JSON-lines file per archived range).",
        shown="`<var dir>/audit-archive`", section=AUDIT)

    # --- operators' console ---
    console_refresh_seconds: Seconds = setting(
        10, "How often an open queue page in the console checks for changes (it reloads itself when the "
        "operator is idle, and says so when rows are selected).", section=CONSOLE)

    # Issue 36: bulk recovery (tools_app.bulk), run by the cluster in batches.
    bulk_batch_size: int = setting(
        500, "Items a bulk action handles per django-q2 job; its progress is counted and a Stop takes effect "
        "between two batches.", ge=1, le=10_000, section=CONSOLE)
    bulk_stall_minutes: int = setting(
        5, "A running bulk action with no progress for this long (its job was lost: a cluster died) is queued "
        "again by the sweep; a batch taking longer is not run twice (one batch of an action at a time).",
        ge=1, section=CONSOLE)

    step_up_minutes: Seconds = setting(
        10, "An approval above its tenant's step-up amount needs a second-factor code entered within this many "
        "minutes; an older one is asked for again.", section=CONSOLE)
    login_failure_limit: int = setting(
        5, "Failed console logins for one user from one address before both are locked out (django-axes).",
        ge=1, section=CONSOLE)
    login_lockout_minutes: Seconds = setting(
        15, "How long a console login locked out after failures stays locked.", section=CONSOLE)

    # --- testing ---
    crash_points: Annotated[list[CrashPoint], NoDecode] = setting(
        [], "Crash tests only: the process SIGKILLs itself at these points of the engine "
        "(tools_app/core/crashpoints.py). Never in production.", section=TESTING)
    encrypt_personal_values: bool = setting(
        True, "Benchmarks only: off, personal values are stored in clear (bench/bench_encryption.py measures what "
        "encryption costs against it). Production refuses it off.", section=TESTING)
    conformance_test_tools: bool = setting(
        False, "Conformance tests only: /mcp also serves the test-only tools the official MCP conformance suite's "
        "tool scenarios call (tools_app/mcp/conformance_tools.py) and answers `logging/setLevel`. Never in "
        "production.", section=TESTING)

    @field_validator("kek", "kek_previous")
    @classmethod
    def _kek_shape(cls, value: Any) -> Any:
        """A key-encryption key is 32 random bytes in base64."""
        for secret in value if isinstance(value, list) else [value]:
            if secret is not None and not _is_key_of_32_bytes(secret.get_secret_value()):
                raise ValueError("not 32 bytes in base64 (make one with: python -c 'import os, base64; "
                                 "print(base64.b64encode(os.urandom(32)).decode())')")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> IdemopsSettings:
        problems = []
        if self.execution_heartbeat_seconds >= self.execution_lease_seconds:
            problems.append(_must_be_less("execution_heartbeat_seconds", self.execution_heartbeat_seconds,
                                          "execution_lease_seconds", self.execution_lease_seconds,
                                          "a lease must be renewed before it runs out"))
        if self.task_heartbeat_seconds >= self.task_lease_seconds:
            problems.append(_must_be_less("task_heartbeat_seconds", self.task_heartbeat_seconds,
                                          "task_lease_seconds", self.task_lease_seconds,
                                          "a lease must be renewed before it runs out"))
        if self.task_backoff_base_seconds > self.task_backoff_max_seconds:
            problems.append(f"{env_name('task_backoff_base_seconds')}={self.task_backoff_base_seconds:g} is more "
                            f"than {env_name('task_backoff_max_seconds')}={self.task_backoff_max_seconds:g}: the "
                            "base of a backoff cannot exceed its ceiling")
        if self.task_slice_seconds >= self.q_timeout_seconds:
            problems.append(_must_be_less("task_slice_seconds", self.task_slice_seconds, "q_timeout_seconds",
                                          self.q_timeout_seconds, "a job must hand its task on before "
                                          "django-q2 kills it"))
        if self.env == "production":
            problems += self._production_problems()
        if problems:
            raise PydanticCustomError("inconsistent_settings", "\n".join(problems).replace("{", "{{")
                                      .replace("}", "}}"))
        return self

    def _production_problems(self) -> list[str]:
        """What IDEMOPS_ENV=production refuses: each a default that is safe on a laptop only."""
        production = f"{env_name('env')}=production"
        problems = []
        if self.database_url is None:
            problems.append(f"{env_name('database_url')} is not set: {production} never starts an embedded "
                            "PostgreSQL server")
        elif self.embedded_database:
            problems.append(f"{env_name('embedded_database')} is set: {production} never runs on an embedded "
                            "PostgreSQL server")
        if self.secret_key is None:
            problems.append(f"{env_name('secret_key')} is not set: {production} does not generate one (every "
                            "process must share it)")
        problems += self._production_key_problems(production)
        if self.debug:
            problems.append(f"{env_name('debug')} is on: {production} never shows tracebacks")
        if self.demo:
            problems.append(f"{env_name('demo')} is on: {production} creates no demo tenant, people or token")
        problems += self._production_address_problems(production)
        if self.crash_points:
            problems.append(f"{env_name('crash_points')} is set: {production} never kills itself for a test")
        if self.conformance_test_tools:
            problems.append(f"{env_name('conformance_test_tools')} is on: {production} serves no test-only tools")
        return problems

    def _production_key_problems(self, production: str) -> list[str]:
        """What IDEMOPS_ENV=production refuses of where the keys of personal values come from."""
        problems = []
        if self.kek is None and self.kek_file is None:
            problems.append(f"{env_name('kek')} (or {env_name('kek_file')}) is not set: {production} never keeps "
                            "the key-encryption key of personal values beside the data keys it wraps")
        if self.keystore_url is None:
            problems.append(f"{env_name('keystore_url')} is not set: {production} keeps the data keys of personal "
                            "values in a database of their own")
        if not self.encrypt_personal_values:
            problems.append(f"{env_name('encrypt_personal_values')} is off: {production} stores personal values "
                            "encrypted")
        return problems

    def _production_address_problems(self, production: str) -> list[str]:
        """What IDEMOPS_ENV=production refuses of the addresses the server is reached at."""
        problems = []
        if urlsplit(self.public_url).scheme != "https":
            problems.append(f"{env_name('public_url')}={self.public_url!r} is not https://: {production} "
                            "serves over TLS only")
        if self.allowed_hosts == type(self).model_fields["allowed_hosts"].default:
            problems.append(f"{env_name('allowed_hosts')} is the development default "
                            f"({','.join(self.allowed_hosts)}): {production} needs the host names clients use")
        if self.mcp_allowed_hosts == type(self).model_fields["mcp_allowed_hosts"].default:
            problems.append(f"{env_name('mcp_allowed_hosts')} is the development default "
                            f"({','.join(self.mcp_allowed_hosts)}): {production} needs the host names MCP "
                            "clients use (any other Host header is refused)")
        return problems


def _must_be_less(name: str, value: float, limit_name: str, limit: float, why: str) -> str:
    return f"{env_name(name)}={value:g} must be less than {env_name(limit_name)}={limit:g}: {why}"


def _is_key_of_32_bytes(text: str) -> bool:
    import base64
    import binascii

    try:
        return len(base64.b64decode(text.strip(), validate=True)) == 32
    except (binascii.Error, ValueError):
        return False


def env_name(field_name: str, model: type[EnvironmentSettings] | None = None) -> str:
    """The environment variable of a field (of the platform's settings, or of `model`)."""
    field = (model or IdemopsSettings).model_fields[field_name]
    return field.validation_alias if isinstance(field.validation_alias, str) else PREFIX + field_name.upper()


def environment_names() -> dict[str, str]:
    """Environment variable -> field name, for every setting."""
    return {env_name(name): name for name in IdemopsSettings.model_fields}
