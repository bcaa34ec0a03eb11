"""Per-tenant limits, enforced in the database so they hold across every web process.

- Calls per minute, for the tenant and for each of its tokens: a token bucket per scope
  (RateBucket), refilled continuously and drawn from by ONE statement that locks the
  buckets it needs (always in the same order, so two calls never deadlock), takes a token
  from each only if every one has one, and says how long until they would.
- Unfinished long tasks per agent (the MCP tasks spec: servers SHOULD limit them):
  counted under a transaction-scoped advisory lock of the agent, in the transaction that
  creates the task (tools_app.tasks), so two starts racing cannot both take the last place.

Over a limit the call is refused at once with `rate_limited` and `retry_after`: nothing is
queued, nothing done. Each tenant's limits are a TenantLimits row an operator edits in the
admin (`change_limits`, audited); a missing row or field takes the IDEMOPS_* default, and 0
means no limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ObjectDoesNotExist
from django.db import connection, transaction

from tools_app.access.authorization import Permit, authorize
from tools_app.access.models import AgentConnection, ApiToken, RateBucket, Tenant, TenantLimits
from tools_app.conf import conf
from tools_app.core import audit, db
from tools_app.core.errors import InvalidInput, RateLimited

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

# How soon to ask again when the agent's task places are all taken: tasks take seconds to minutes.
TASKS_RETRY_AFTER_SECONDS = 5.0

LIMIT_FIELDS = ("calls_per_minute", "calls_per_minute_per_token", "concurrent_tasks_per_agent")
DEFAULTS = {"calls_per_minute": "rate_limit_calls_per_minute",
            "calls_per_minute_per_token": "rate_limit_calls_per_minute_per_token",
            "concurrent_tasks_per_agent": "max_concurrent_tasks_per_agent"}

CHANGE_LIMITS = Permit("tools_app.set_tenant_limits", "change_limits", "change a tenant's limits",
                       "limits.change_refused")


def effective(tenant: Tenant) -> dict[str, int]:
    """The tenant's limits: its own where set, else the defaults (0: no limit)."""
    try:
        own = tenant.limits
    except ObjectDoesNotExist:
        own = None
    return {name: (value if (value := getattr(own, name, None)) is not None else getattr(conf(), DEFAULTS[name]))
            for name in LIMIT_FIELDS}


# --- calls per minute -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallLimits:
    """What one authenticated caller may call: its tenant's and its token's rate (per minute; 0: none)."""

    tenant_id: int
    token_id: int
    tenant_per_minute: int = 0
    token_per_minute: int = 0

    def buckets(self) -> list[tuple[str, int]]:
        return [(scope, per_minute) for scope, per_minute in (
            (f"tenant:{self.tenant_id}", self.tenant_per_minute), (f"token:{self.token_id}", self.token_per_minute))
            if per_minute]

    def as_claims(self) -> list[int]:
        return [self.tenant_id, self.token_id, self.tenant_per_minute, self.token_per_minute]

    @classmethod
    def from_claims(cls, claims: list[int]) -> CallLimits:
        return cls(*claims)


def call_limits(token: ApiToken) -> CallLimits:
    """The limits of an authenticated ApiToken (its tenant and limits loaded with it)."""
    limits = effective(token.tenant)
    return CallLimits(tenant_id=token.tenant_id, token_id=token.pk, tenant_per_minute=limits["calls_per_minute"],
                      token_per_minute=limits["calls_per_minute_per_token"])


def oauth_call_limits(connection: AgentConnection) -> CallLimits:
    """The limits of an OAuth agent: its tenant's, and the per-token rate on its connection (a negative id,
    so its bucket is never an API token's)."""
    limits = effective(connection.tenant)
    return CallLimits(tenant_id=connection.tenant_id, token_id=-connection.pk,
                      tenant_per_minute=limits["calls_per_minute"],
                      token_per_minute=limits["calls_per_minute_per_token"])


def admit_call(limits: CallLimits) -> None:
    """Take one call from each of the caller's buckets, or raise RateLimited (taking nothing)."""
    buckets = limits.buckets()
    if not buckets:
        return
    rows = _draw(buckets)
    if len(rows) < len(buckets):  # a bucket's first use: create it full, then draw
        _create(buckets)
        rows = _draw(buckets)
    if all(admitted for _, admitted, _, _ in rows):
        return
    waits = [(1 - level) / rate for _, _, level, rate in rows if level < 1]
    scopes = [scope.split(":")[0] for scope, _, level, _ in rows if level < 1]
    raise RateLimited(f"over the {' and '.join(sorted(set(scopes)))} limit of calls per minute; nothing was done. "
                      "Retry with the same key after retry_after", retry_after=math.ceil(max(waits) * 100) / 100)


# One statement: lock the buckets in scope order, refill each by the time since it was last
# refilled (the database's clock), and draw one token from each only if every one has one.
_DRAW = """
WITH wanted(scope, rate, capacity) AS (SELECT * FROM unnest(%s::text[], %s::float8[], %s::float8[])),
current AS (
    SELECT b.scope, w.rate,
           least(w.capacity, b.tokens + w.rate * extract(epoch FROM statement_timestamp() - b.refilled_at)) AS level
    FROM {table} b JOIN wanted w ON w.scope = b.scope
    ORDER BY b.scope
    FOR UPDATE OF b
),
-- A bucket not created yet counts as a refusal here: nothing is drawn until all exist.
verdict AS (SELECT bool_and(level >= 1) AND count(*) = cardinality(%s::text[]) AS admitted FROM current)
UPDATE {table} b
SET tokens = current.level - CASE WHEN verdict.admitted THEN 1 ELSE 0 END, refilled_at = statement_timestamp()
FROM current, verdict
WHERE b.scope = current.scope
RETURNING b.scope, verdict.admitted, current.level, current.rate
"""


def _columns(buckets: list[tuple[str, int]]) -> list[list[Any]]:
    """(scope, calls per minute) -> the columns of buckets holding a minute's calls, refilled per second."""
    return [[scope for scope, _ in buckets], [per_minute / 60 for _, per_minute in buckets],
            [float(per_minute) for _, per_minute in buckets]]


def _draw(buckets: list[tuple[str, int]], columns: list[list[Any]] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        columns = columns or _columns(buckets)
        cursor.execute(_DRAW.format(table=db.table(RateBucket)), [*columns, columns[0]])
        drawn: list[tuple[Any, ...]] = cursor.fetchall()
        return drawn


def _create(buckets: list[tuple[str, int]], columns: list[list[Any]] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {db.table(RateBucket)} (scope, tokens, refilled_at) "
                       "SELECT scope, capacity, statement_timestamp() "
                       "FROM unnest(%s::text[], %s::float8[], %s::float8[]) AS w(scope, rate, capacity) "
                       "ON CONFLICT (scope) DO NOTHING", columns or _columns(buckets))


def admit_per_hour(scope: str, per_hour: int) -> bool:
    """Take one event from `scope`'s bucket (`per_hour` of them, refilled evenly over an hour), the same
    token buckets as calls; False when it is empty (nothing taken)."""
    columns: list[list[Any]] = [[scope], [per_hour / 3600], [float(per_hour)]]
    rows = _draw([], columns)
    if not rows:
        _create([], columns)
        rows = _draw([], columns)
    return bool(rows and rows[0][1])


# --- unfinished tasks per agent ---------------------------------------------------------------------------


def concurrent_tasks_limit(tenant_id: int) -> int:
    return effective(Tenant.objects.select_related("limits").get(pk=tenant_id))["concurrent_tasks_per_agent"]


def admit_task(tenant_id: int, actor: str, unfinished: Callable[[], int]) -> None:
    """Before a task of `actor` is created, in its transaction: raise RateLimited if the agent has
    its limit of unfinished tasks already (`unfinished()` counts them). The advisory lock
    serialises the agent's starts until this transaction ends."""
    limit = concurrent_tasks_limit(tenant_id)
    if not limit:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"idemops:tasks:{tenant_id}:{actor}"])
    if (count := unfinished()) >= limit:
        raise RateLimited(f"{count} of this agent's tasks are unfinished, its limit is {limit}: nothing was started. "
                          "Wait for one to finish (or cancel one), then call again with the same key",
                          retry_after=TASKS_RETRY_AFTER_SECONDS)


# --- the operators' side ------------------------------------------------------------------------------------


def change_limits(tenant: Tenant, who: User | AnonymousUser, changes: dict[str, int | None]) -> TenantLimits:
    """An operator sets a tenant's limits (None: back to the default). Audited, before and after."""
    unknown = sorted(set(changes) - set(LIMIT_FIELDS))
    if unknown:
        raise InvalidInput(f"no such limit: {', '.join(unknown)}")
    for name, value in changes.items():
        if value is not None and (not isinstance(value, int) or value < 0):
            raise InvalidInput(f"{name}: a whole number, 0 or more (or empty for the default)")
    # An empty row means "the defaults": creating it changes nothing, and gives a refusal an object to name.
    limits, _ = TenantLimits.objects.get_or_create(tenant=tenant)
    actor = authorize(who, CHANGE_LIMITS, limits)
    with transaction.atomic():
        limits = TenantLimits.objects.select_for_update().get(pk=limits.pk)
        before = {name: getattr(limits, name) for name in LIMIT_FIELDS}
        for name, value in changes.items():
            setattr(limits, name, value)
        limits.save()
        audit.record_event(action="limits.changed", obj=limits, actor=actor, before=before,
                           after={name: getattr(limits, name) for name in LIMIT_FIELDS})
    return limits
