"""The probes orchestrators read.

- GET /livez: the process answers (no query: a database outage must not get every web process
  restarted, which would not bring the database back).
- GET /readyz: the database answers, and so does the job queue: django-q2's ORM broker table
  (`django_q_ormq`, on the same database) can be read. 503 with the failed check and Retry-After
  when not, so a load balancer sends calls elsewhere meanwhile.
- GET /healthz: the same as /readyz (its name before the two probes).

Orchestrators call them by the process's own address (`curl http://127.0.0.1:8000/livez` in the
systemd sample, the pod's IP in Kubernetes), never by the public host name: `ProbesMiddleware`, first
in MIDDLEWARE, answers them before anything reads the Host header. Every other path keeps Django's
ALLOWED_HOSTS check (`request.get_host()`, which CommonMiddleware calls on every request).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NotRequired, TypedDict

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from django_q.brokers import get_broker

from tools_app.core import outage


class Check(TypedDict):
    """One check's line in /readyz's answer."""

    ok: bool
    queued: NotRequired[int]
    error: NotRequired[str]


def check_database() -> Check:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"ok": True}


def check_queue() -> Check:
    # The ORM broker's ping() answers True without asking anything: counting its table is the check.
    return {"ok": True, "queued": get_broker().queue_size()}


@require_GET
def livez(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, Check] = {}
    for name, check in (("database", check_database), ("queue", check_queue)):
        try:
            checks[name] = check()
        except Exception as exc:  # report, don't raise: this is what orchestrators read
            checks[name] = {"ok": False, "error": type(exc).__name__}
    if all(c["ok"] for c in checks.values()):
        return JsonResponse({"status": "ok", "checks": checks})
    failed = ", ".join(name for name, c in checks.items() if not c["ok"])
    return JsonResponse({"status": "unavailable", "reason": f"unreachable: {failed}", "checks": checks},
                        status=503, headers={"Retry-After": outage.retry_after_header()})


PROBES: dict[str, Callable[[HttpRequest], HttpResponse]] = {"/livez": livez, "/readyz": readyz, "/healthz": readyz}


class ProbesMiddleware:
    """The probes, answered whatever the Host header: a probe by address would otherwise get Django's 400
    ("Invalid HTTP_HOST header") with production's ALLOWED_HOSTS, and `idemops serve`, the kubelet or the
    systemd watchdog would take a healthy process for a dead one. Nothing the probes answer depends on
    the host (no redirect, no link, no cookie), which is why only they skip the check."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        return probe(request) if probe is not None else self.get_response(request)
