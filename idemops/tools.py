"""The public tool API of idemops: what an adopter's Django app imports to declare its own tools.

Import this module and nothing else of idemops (`make lint` holds the demo app, `idemops_demo`, to
that rule, so the demo proves the API is enough). Names here keep their meaning and signature
within a major `API_VERSION`; `tests/platform/test_public_api.py` fails when one disappears or
changes. docs/adopting.md walks through it; docs/tools-api.md lists every name.

Where tools are found: every installed Django app's `idemops_tools` module is imported at start-up
(as the admin imports each app's `admin.py`), and so is every module named in
`IDEMOPS_TOOL_MODULES`. Importing a module that declares tools registers them.

What a declaration says (`write_tool`, `read_tool`, `long_tool`):
- its name, title and description; its pydantic input and output models are the handler's
  annotations, `(ctx: ToolContext, args: SomeInput) -> SomeOutput` (`WriteInput` for writes: it
  carries `idempotency_key`; `StrictModel` for nested models), and every rule reading the arguments
  (`approval`, `confirmation`, `check`, `concurrency_key`) is typed over the same model;
- `personal_fields` (never logged, purged after retention), `non_business_fields` (left out of the
  fingerprint), `retention=Retention(key=, on_expiry=ExpiryPolicy…, keep=KeepFor…)`;
- for a write whose effect happens in another system: `reconciliation=Reconciliation(reconciler)`,
  the reconciler given a `SentCall[SomeInput]` (the call's `args`, the `downstream_key` it sent) and
  answering `Found` / `NotDone` / `StillUnknown` (use `ctx.downstream_key` as the key you send, and
  `downstream_request` to send it: every failure comes back classified);
- `approval`: `(tenant, args) -> ApprovalPolicy | None` (`amount_policy` for money);
- `confirmation`: `(tenant, args) -> ConfirmationPolicy | None`: the person behind the agent confirms
  the call through their MCP host first (its summary names only what they sent);
- `requires_operation_id=True` for a high-risk write: its key must be an id `prepare_operation`
  issued;
- `concurrency_key` (an argument's name, or `args -> str`): the business entity a write acts on;
  two operations on one entity never run at once, in any process;
- for a long tool: a `Pipeline` of checkpointed `Step`s (with `compensate` for a saga,
  `ctx.each_batch` for chunked batches, `WaitFor` to pause for a person, `ctx.wait_for_event` /
  `ctx.sleep_until` for durable waits, answered by `send_event`; `version`, `previous` and
  `ctx.patched` when a deploy changes the steps); its `input_model` names the model its `approval`,
  `operation_arguments` and steps (`StepContext[SomeInput]`) read, and its `retention` is a `Retention`.
"""

from __future__ import annotations

from tools_app.access.models import Tenant
from tools_app.admin.scoping import ReadOnlyAdmin, TenantScopedAdmin
from tools_app.approvals import amount_policy
from tools_app.core.backoff import retry_after_header
from tools_app.core.crashpoints import crash_point
from tools_app.core.errors import (
    DownstreamConflict,
    ErrorClass,
    InvalidInput,
    NotFound,
    PermissionDenied,
    ToolFailure,
    Transient,
    UnknownOutcome,
    invalid_data,
)
from tools_app.core.redaction import public_url
from tools_app.core.tracing import request as traced_request
from tools_app.core.url_allowlist import Target as CheckedUrl
from tools_app.core.url_allowlist import check as check_url
from tools_app.engine import ExpiryPolicy, evidence_entry
from tools_app.outbox import enqueue as enqueue_message
from tools_app.outbox import find as find_message
from tools_app.outbox import relay_one as relay_message
from tools_app.outbox.models import OutboxEvent as Message
from tools_app.outbox.models import OutboxStatus as MessageStatus
from tools_app.reconciliation import CallbackVerdict, settle_by_callback
from tools_app.retention import register_retained
from tools_app.tasks.waits import send_event
from tools_app.toolkit.downstream import request as downstream_request
from tools_app.toolkit.pipelines import Pipeline, RetryPolicy, Step, StepContext, WaitFor
from tools_app.toolkit.pipelines import task_tool as long_tool
from tools_app.toolkit.policies import ApprovalPolicy, ConfirmationPolicy, Found, KeepFor, NotDone, StillUnknown
from tools_app.toolkit.registry import (
    ObjectId,
    Reconciliation,
    Retention,
    SentCall,
    StrictModel,
    ToolContext,
    ToolInput,
    ToolSpec,
    WriteInput,
    read_tool,
    write_tool,
)

# The API's version: a name removed or a signature changed incompatibly is a new major version.
# 1.2: models read from the handler's annotations, rules typed over the input model, `Retention` and
# `Reconciliation` group their keywords (the old keywords still work, with a DeprecationWarning).
# 2.0: KeepFor(kinds=...) and register_retained(default=, description=) (issue 39).
# 2.1: a reconciler and result_for_reference are given a `SentCall[Input]` (the call's `args`, its
# `downstream_key`, `key`, `tenant`, `record`), `Reconciliation` is typed over the handler's input model;
# `long_tool` takes `retention=Retention(...)` and types `approval` and `operation_arguments` over its
# `input_model` (a reconciler annotated for the record, and long_tool's flat `on_expiry`/`keep`/duration,
# still run, with a DeprecationWarning).
API_VERSION = "2.1"

__all__ = [
    "API_VERSION",
    # declaring tools
    "write_tool", "read_tool", "long_tool", "ToolSpec", "ToolContext", "ToolInput", "WriteInput", "StrictModel",
    "ObjectId",
    # policies
    "Retention", "Reconciliation", "SentCall", "ExpiryPolicy", "KeepFor", "ApprovalPolicy", "ConfirmationPolicy",
    "amount_policy", "Found",
    "NotDone", "StillUnknown",
    "evidence_entry",
    # long tools
    "Pipeline", "Step", "StepContext", "RetryPolicy", "WaitFor", "send_event",
    # errors an agent can act on
    "ToolFailure", "ErrorClass", "InvalidInput", "NotFound", "PermissionDenied", "Transient", "UnknownOutcome",
    "DownstreamConflict", "invalid_data",
    # calling other systems
    "downstream_request", "traced_request", "retry_after_header", "check_url", "CheckedUrl", "public_url",
    "settle_by_callback", "CallbackVerdict",
    # messages written with the call, delivered at least once (the outbox)
    "enqueue_message", "relay_message", "find_message", "Message", "MessageStatus",
    # what the platform keeps of an app's own objects
    "register_retained", "Tenant",
    # the console
    "TenantScopedAdmin", "ReadOnlyAdmin",
    # fault injection for an app's own crash tests
    "crash_point",
]
