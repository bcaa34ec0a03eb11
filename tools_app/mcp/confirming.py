"""How an MCP host is asked to have its person confirm a call (tools_app.approvals.confirmations).

- 2026-07-28: the call answers an input-required result carrying one form elicitation (the summary,
  and a `confirm` box) and a request state naming the question; the host asks its person and calls
  again with their answer and the state. The SDK's RequestStateBoundary seals that state (AES-256-GCM)
  under keys derived from the secret key (every web process shares it; its fallbacks still open state
  sealed before a rotation), binding it to the tool, the arguments, the bearer token's principal and
  a deadline; the confirmation row binds it again and is taken once.
- 2025-11-25 on a stateful session (/mcp/session): the call sends `elicitation/create` and waits for
  the answer.
- A host that declares no form elicitation, or a stateless connection at 2025-11-25, hears
  `confirmation_required` with the confirmation page's link (details.confirmation.url, also as a
  URL-mode elicitation in details.elicitation): its person confirms there, behind their login, and
  the agent calls again with the same key. Nothing ever runs unasked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from django.conf import settings
from mcp.server.mcpserver import Context, RequestStateSecurity
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from pydantic import BaseModel, Field

from tools_app.approvals.confirmations import Answer, Confirming
from tools_app.core.errors import ConfirmationRequired, ToolFailure
from tools_app.toolkit.calls import CallResult

INPUT_KEY = "io.idemops/confirm"
STATE_VERSION = 1
# The envelope's own lifetime; each confirmation's deadline (its policy's ttl) is checked on its row.
STATE_TTL_SECONDS = 24 * 3600.0
_KEY_LABEL = b"idemops/mcp/request-state/v1"


def request_state_security() -> RequestStateSecurity:
    """The SDK's sealing of request state, under keys derived from SECRET_KEY and its fallbacks (rotation:
    state sealed under an old key opens while that key is a fallback)."""
    keys: list[str] = []
    for secret in [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]:
        derived = hmac.new(str(secret).encode(), _KEY_LABEL, hashlib.sha256).hexdigest()
        if derived not in keys:
            keys.append(derived)
    return RequestStateSecurity(keys=keys, ttl=STATE_TTL_SECONDS, audience="idemops")


class ConfirmForm(BaseModel):
    confirm: bool = Field(description="Confirm: run this operation. Leave unchecked, or decline, to refuse it.")


def host_name(ctx: Context) -> str:
    params = ctx.session.client_params
    if params is None:
        return "unnamed host"
    info = params.client_info
    return f"{info.name} {info.version}".strip()[:200]


def can_elicit_form(ctx: Context) -> bool:
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    # A bare `elicitation: {}` (before modes existed) means form.
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def modern(ctx: Context) -> bool:
    version = ctx.protocol_version
    return version is not None and version >= "2026-07-28"


def confirming(ctx: Context) -> Confirming:
    """The host, and the answer its call carries (2026-07-28: the input response and the request state
    the boundary unsealed). A request state naming no question of ours is an answer to nothing: refused."""
    host = host_name(ctx)
    state = ctx.request_state
    if not modern(ctx) or state is None:
        return Confirming(host=host)
    try:
        token = json.loads(state)["confirmation"]
    except (ValueError, KeyError, TypeError):
        token = ""
    response = (ctx.input_responses or {}).get(INPUT_KEY)
    return Confirming(host=host, answer=Answer(token=str(token), confirmed=confirmed(response)))


def confirmed(response: Any) -> bool:
    """Only an accepted form with `confirm` true confirms; decline, cancel or anything else declines."""
    if not isinstance(response, ElicitResult) or response.action != "accept":
        return False
    return (response.content or {}).get("confirm") is True


def question(error: ToolFailure) -> dict[str, Any] | None:
    if not isinstance(error, ConfirmationRequired):
        return None
    asked: dict[str, Any] = error.details["confirmation"]
    return asked


def form(asked: dict[str, Any]) -> ElicitRequestFormParams:
    return ElicitRequestFormParams(
        message=f"Confirm this operation: {asked['summary']}",
        requested_schema={"type": "object", "properties": {"confirm": {
            "type": "boolean", "title": "Confirm", "description": "Run this operation", "default": False}},
            "required": ["confirm"]})


def input_required(asked: dict[str, Any]) -> InputRequiredResult:
    return InputRequiredResult(
        input_requests={INPUT_KEY: ElicitRequest(params=form(asked))},
        request_state=json.dumps({"v": STATE_VERSION, "confirmation": asked["id"]}))


async def elicit(ctx: Context, asked: dict[str, Any]) -> Answer | None:
    """Ask over the session (2025-11-25); None when the person dismissed the question (nothing decided)."""
    result = await ctx.elicit(form(asked).message, ConfirmForm)
    if result.action == "cancel":
        return None
    return Answer(token=asked["id"], confirmed=result.action == "accept" and bool(result.data.confirm))


def with_page_link(result: CallResult) -> CallResult:
    """The answer for a host that cannot ask: the class, and the confirmation page as a URL-mode elicitation."""
    error = result.error
    asked = question(error) if error is not None else None
    if error is None or asked is None:
        return result
    elicitation = {"mode": "url", "message": f"Confirm this operation: {asked['summary']}", "url": asked["url"],
                   "elicitationId": asked["id"]}
    return CallResult(result.spec, error=error.replaced(details={**error.details, "elicitation": elicitation}),
                      record=result.record, replayed=result.replayed)
