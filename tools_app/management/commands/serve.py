"""`make run`: migrate, create the demo (IDEMOPS_DEMO), start every process, print where things are.

A process that dies is started again and the others go on (tools_app.management.supervisor),
the embedded PostgreSQL server included. Ctrl-C (or SIGTERM) stops every process this command
started, and the embedded PostgreSQL server if that is what it ran on; so does a process that
keeps dying (IDEMOPS_SERVE_RESTART_LIMIT).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from idemops import embedded_pg
from tools_app.conf import conf
from tools_app.core import polling
from tools_app.management.demo import DEMO_STEP_UP_AMOUNT, ensure_demo
from tools_app.management.supervisor import Child, EmbeddedPostgres, KeepsDying, Supervised, Supervisor, stop_processes

# granian's access line in uvicorn's shape (its path carries no query string).
ACCESS_LOG_FORMAT = '%(addr)s - "%(method)s %(path)s %(protocol)s" %(status)d'

ProcessSpec = tuple[str, list[str]]  # (name, argv)
Process = tuple[str, subprocess.Popen[bytes]]  # (name, the running child)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run the whole platform in the foreground: web (admin, API, /mcp) and the job clusters."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=conf().host, help=f"default: IDEMOPS_HOST ({conf().host})")
        parser.add_argument("--port", type=int, default=conf().port, help=f"default: IDEMOPS_PORT ({conf().port})")
        parser.add_argument("--web-workers", type=int, default=conf().web_workers,
                            help=f"default: IDEMOPS_WEB_WORKERS ({conf().web_workers})")
        parser.add_argument("--q-clusters", type=int, default=conf().q_clusters,
                            help=f"default: IDEMOPS_Q_CLUSTERS ({conf().q_clusters})")

    def handle(self, host: str, port: int, web_workers: int, q_clusters: int, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        demo = ensure_demo() if conf().demo else None
        children = [Child(name, argv) for name, argv in self.process_specs(host, port, web_workers, q_clusters)]
        units: list[Supervised] = [*children]
        if settings.EMBEDDED_DATABASE:
            units.insert(0, EmbeddedPostgres(conf().pgdata.resolve()))  # running already: settings started it
        supervisor = Supervisor(units, limit=conf().serve_restart_limit, window=conf().serve_restart_window_seconds)
        for child in children:
            child.start()
        # Also when started in the background, where SIGINT arrives ignored.
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            self.wait_until_healthy(f"http://{host}:{port}/readyz", supervisor)
            self.print_banner(f"http://{host}:{port}", demo)
            supervisor.watch()
        except KeepsDying as exc:
            self.stderr.write(str(exc))
            raise SystemExit(1) from exc
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            self.stop([(child.name, child.process) for child in children if child.process is not None])
            if settings.EMBEDDED_DATABASE:
                embedded_pg.stop(conf().pgdata.resolve())

    def process_specs(self, host: str, port: int, web_workers: int, q_clusters: int = 1) -> list[ProcessSpec]:
        """The web server (granian with `web_workers` processes) and `q_clusters` job clusters, each
        an `idemops qcluster` of IDEMOPS_Q_WORKERS workers: they share the one queue (django-q2's ORM
        broker) and need no coordination of their own."""
        python = sys.executable
        specs: list[ProcessSpec] = [
            # Its access log follows IDEMOPS_ACCESS_LOG (LOGGING in idemops/settings.py), like every log line.
            ("web", self.web_argv(host, port, web_workers)),
        ]
        specs += [(f"jobs-{n}" if q_clusters > 1 else "jobs", [python, "-m", "idemops", "qcluster"])
                  for n in range(1, q_clusters + 1)]
        # An installed app's own processes (the demo's downstream systems): its AppConfig's
        # `idemops_processes(python)` -> [(name, argv), ...].
        for config in apps.get_app_configs():
            if hasattr(config, "idemops_processes"):
                specs += config.idemops_processes(python)
        return specs

    @staticmethod
    def web_argv(host: str, port: int, web_workers: int) -> list[str]:
        """granian (a Rust ASGI server) rather than uvicorn: side by side it serves /mcp calls
        faster (docs/benchmarks.md, P4); any ASGI server can serve idemops.asgi:application."""
        granian = str(Path(sys.executable).parent / "granian")
        # Its access lines read like uvicorn's, so tools_app.core.logs turns either into the same fields.
        access = ["--access-log", "--access-log-fmt", ACCESS_LOG_FORMAT] if conf().access_log else []
        # A worker that dies is granian's to replace; granian itself is `serve`'s (or the supervisor's).
        return [granian, "--interface", "asgi", "--host", host, "--port", str(port), "--workers", str(web_workers),
                "--respawn-failed-workers", *access, "idemops.asgi:application"]

    def wait_until_healthy(self, url: str, supervisor: Supervisor, timeout: float = 120) -> None:
        """Until `url` answers 200; a process that dies meanwhile is started again (KeepsDying if it keeps dying).
        A bound, not a pace: on a loaded machine granian's workers, each importing Django, took over 30 s."""
        def healthy() -> bool:
            supervisor.check()
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    status: int = response.status
                    return status == 200
            except OSError:
                return False

        if not polling.until(healthy, seconds=timeout, pause=0.3):
            raise SystemExit(f"{url} did not become healthy within {timeout}s")

    def stop(self, processes: list[Process]) -> None:
        stop_processes(processes, self.stderr.write)

    def print_banner(self, base: str, demo: dict[str, str] | None) -> None:
        self.stdout.write(banner(base, demo))


def _mcp_call(base: str, token: str, tool: str, arguments: str) -> str:
    return (f"curl -s {base}/mcp -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' "
            "-H 'Accept: application/json, text/event-stream' -d '{\"jsonrpc\":\"2.0\",\"id\":1,"
            f"\"method\":\"tools/call\",\"params\":{{\"name\":\"{tool}\",\"arguments\":{arguments}}}}}'")


def banner(base: str, demo: dict[str, str] | None) -> str:
    """What `make run` prints: enough for a new operator to reach every kind of work item."""
    if demo is None:
        return without_demo(base)
    token = demo.get("token", "(issued earlier; see var/demo-credentials.json)")
    order = _mcp_call(base, token, "create_order", '{"customer":"ACME","items":[{"sku":"BOLT-1","quantity":3,'
                      '"unit_price":"2.50"}],"currency":"EUR","idempotency_key":"demo-order-1"}')
    # A payment is high-risk: the server issues its operation id (prepare_operation), the key of the payment.
    payment_arguments = '{"amount":"2500.00","currency":"EUR","payee":"ACME"}'
    prepare = _mcp_call(base, token, "prepare_operation", '{"tool":"request_payment","arguments":'
                        f'{payment_arguments},"idempotency_key":"demo-payment-1"}}')
    payment = _mcp_call(base, token, "request_payment",
                        payment_arguments[:-1] + ',"idempotency_key":"OPERATION_ID"}')
    kept = "(in var/demo-credentials.json)"
    admin = f"user {demo['admin_user']}  password {demo.get('admin_password', kept)}"
    approver = f"user {demo.get('approver_user', 'alice')}  password {demo.get('approver_password', kept)}"
    admin_totp = _totp(demo, "admin")
    approver_totp = _totp(demo, "approver")
    passkey_base = base.replace("://127.0.0.1", "://localhost")  # the relying party (settings.OTP_WEBAUTHN_RP_ID)
    return f"""
idemops is running.
  Console   {base}/admin/   the operators' console: the work queues first (pending approvals, UNKNOWN
            outcomes, failed or stuck tasks, dead letters), each page saying how to settle its rows;
            the box at the top finds any record by idempotency key or id; press ? for the keyboard.
    {admin}   superuser; owns the demo agent, so cannot approve its requests
      {admin_totp}
    {approver}   approver of tenant demo, emailed when the agent asks
      {approver_totp}
            every change (approve, resolve, re-drive...) needs the authenticator code at login: add the
            otpauth URI to an authenticator app, or print a code with: oathtool --totp -b SECRET
            or register a passkey on {passkey_base}/admin/second-factor/ (browsers offer passkeys on a
            host name, not on an address)
  MCP       {base}/mcp      tenant demo, bearer token {token}
            or by OAuth: give an MCP host {base}/mcp; it sends you to the console to consent (docs/auth.md)
  Probes    {base}/livez  {base}/readyz   Metrics {base}/metrics (Prometheus; from this machine)
  Payment gateway (demo downstream)  http://127.0.0.1:8001   notification sink  http://127.0.0.1:8002/messages
            (approvers' emails land in the sink: open the link in one, log in as the approver, decide)
  Database  {'embedded PostgreSQL in ' + str(conf().pgdata) if settings.EMBEDDED_DATABASE else 'DATABASE_URL'}

Create an order (run it twice: the second call returns the same order, marked replayed):
  {order}

Ask for a payment above 1,000 EUR: it waits in Pending approvals, and alice is emailed. A payment is
high-risk, so the server names it: prepare it, then pay with the "operation_id" at the top of its
structuredContent in place of OPERATION_ID (not idempotency.operation_id: that one names the prepare call):
  {prepare}
  {payment}
It is above the demo's step-up amount ({DEMO_STEP_UP_AMOUNT:,} EUR): approving it asks alice for a fresh
authenticator code once the code of her login is older than {conf().step_up_minutes:g} minutes.

Ctrl-C stops everything.
"""


def _totp(demo: dict[str, str], role: str) -> str:
    secret = demo.get(f"{role}_totp_secret")
    if not secret:
        return "authenticator: (see var/demo-credentials.json)"
    return f"authenticator secret {secret}  {demo.get(f'{role}_otpauth_uri', '')}"


def without_demo(base: str) -> str:
    """The banner with the demo off (IDEMOPS_DEMO): no tenant, people or token were created."""
    return f"""
idemops is running (no demo: IDEMOPS_DEMO is off).
  Console   {base}/admin/   a superuser first: idemops createsuperuser; then, logged in, enrol an
            authenticator at {base}/admin/second-factor/ (every change needs its code)
  MCP       {base}/mcp      a tenant and its agent's token: idemops create_tenant SLUG --owner USER
  Probes    {base}/livez  {base}/readyz   Metrics {base}/metrics (Prometheus; from this machine)
  Database  {'embedded PostgreSQL in ' + str(conf().pgdata) if settings.EMBEDDED_DATABASE else 'DATABASE_URL'}

Ctrl-C stops everything.
"""
