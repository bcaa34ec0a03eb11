"""POST /api/v1/task-events: a downstream system's callback to tasks waiting for it (durable waits).

A system that a task's step waits for (`ctx.wait_for_event(event, key, ...)`) reports here, with the
tenant's API token (`Authorization: Bearer idem_...`, `manage.py issue_token`): the token names the
tenant, so an event reaches only its own tenant's tasks. The body is JSON:
`{"event": "...", "key": "...", "payload": {...}}` (`payload` optional, any JSON).

Answers: 202 `{"received": "new"}` (stored; the tasks waiting for it are woken, and a task that
waits for it later gets it at once); 200 `{"received": "duplicate"}` (that event and key were sent
before: this one counts for nothing); 401 without a valid token; 400 for a body that is not an
event. See docs/tasks.md, "Durable waits".
"""

from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from tools_app import access
from tools_app.core.errors import InvalidInput
from tools_app.tasks import send_event

MAX_BODY_BYTES = 256 * 1024


@csrf_exempt  # a server-to-server call, authenticated by its bearer token
@require_POST
def task_events(request: HttpRequest) -> JsonResponse:
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    token = access.authenticate_token(raw.strip()) if scheme.lower() == "bearer" and raw.strip() else None
    if token is None:
        response = JsonResponse({"error": "a valid API token is required (Authorization: Bearer ...)"}, status=401)
        response["WWW-Authenticate"] = "Bearer"
        return response
    if len(request.body) > MAX_BODY_BYTES:
        return JsonResponse({"error": f"the body is over {MAX_BODY_BYTES} bytes"}, status=400)
    try:
        body = json.loads(request.body or b"null")
        if not isinstance(body, dict) or not isinstance(body.get("event"), str) or not isinstance(
                body.get("key"), str):
            raise InvalidInput('the body is {"event": "...", "key": "...", "payload": ...}')
        new = send_event(token.tenant_id, body["event"], body["key"], body.get("payload"),
                         sender=f"api-token:{token.agent_identity}")
    except (ValueError, InvalidInput) as invalid:
        return JsonResponse({"error": getattr(invalid, "message", None) or str(invalid)}, status=400)
    return JsonResponse({"received": "new" if new else "duplicate"}, status=202 if new else 200)
