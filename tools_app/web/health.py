"""GET /healthz: is the database reachable, and is the job queue?"""

from __future__ import annotations

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET
from django_q.brokers import get_broker

from tools_app.core import outage


def check_database() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"ok": True}


def check_queue() -> dict:
    broker = get_broker()
    if not broker.ping():
        return {"ok": False}
    return {"ok": True, "queued": broker.queue_size()}


@require_GET
def healthz(request):
    checks = {}
    for name, check in (("database", check_database), ("queue", check_queue)):
        try:
            checks[name] = check()
        except Exception as exc:  # report, don't raise: this is what monitors read
            checks[name] = {"ok": False, "error": type(exc).__name__}
    if all(c["ok"] for c in checks.values()):
        return JsonResponse({"status": "ok", "checks": checks})
    return JsonResponse({"status": "unavailable", "checks": checks}, status=503,
                        headers={"Retry-After": outage.retry_after_header()})
