"""The UNKNOWN-outcomes queue: records whose downstream outcome must be found out."""

from django import forms
from django.contrib import admin
from django.db.models import Q
from django.http import HttpRequest
from django.utils.html import format_html

from tools_app import reconciliation
from tools_app.admin import story as stories
from tools_app.admin.operator_actions import REASON_REQUIRED, OperatorAction, QueueAdmin, age, pretty_json
from tools_app.core import keys
from tools_app.core.errors import ToolFailure
from tools_app.engine.models import RecordStatus
from tools_app.reconciliation.models import UnknownOutcomeQueue


def reconcile_now(request: HttpRequest, record: UnknownOutcomeQueue, reason: str) -> str:
    return f"now {reconciliation.reconcile(record, request.user)}"


def resolve_succeeded(request: HttpRequest, record: UnknownOutcomeQueue, reason: str,
                      downstream_reference: str = "") -> str:
    reconciliation.resolve_by_operator(record, request.user, succeeded=True, reason=reason,
                                       downstream_reference=downstream_reference)
    return "resolved as succeeded"


def resolve_failed(request: HttpRequest, record: UnknownOutcomeQueue, reason: str) -> str:
    reconciliation.resolve_by_operator(record, request.user, succeeded=False, reason=reason)
    return "resolved as failed (the agent may retry with the same key)"


@admin.register(UnknownOutcomeQueue)
class UnknownOutcomeQueueAdmin(QueueAdmin[UnknownOutcomeQueue]):
    queue_filter = {"status": RecordStatus.UNKNOWN}
    stands_out_label = "needs a person"
    what_to_do = ("Writes whose downstream outcome is not known (the answer never came, or the executor died); "
                  "nothing is guessed. The reconciler asks the downstream system by the key we sent, with backoff, "
                  "and marks a record 'needs a person' when it gives up. Reconcile now asks again. If the "
                  "downstream system cannot tell, check it yourself, then Resolve as succeeded (with its reference) "
                  "or as failed (the agent may then retry with the same key). Agents asking meanwhile are told "
                  "unknown_outcome.")
    list_display = ["id", "flag", "tenant", "tool", "waiting", "reconcile_attempts", "needs_person", "last_evidence"]
    list_filter = ["tool", ("tenant", admin.RelatedOnlyFieldListFilter), ("escalated_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    search_fields = ["=operation_id", "=downstream_key", "=trace_id"]
    fields = readonly_fields = (
        "tenant", "tool", "key_digest", "operation_id", "downstream_key", "actor", "created_at", "reconcile_attempts",
        "next_reconcile_at", "escalated_at", "error_message", "evidence_json", "story",
    )
    operator_actions = [
        OperatorAction("reconcile", "Reconcile now", reconciliation.RECONCILE, reconcile_now,
                       refused=(ToolFailure,), help_text="Asks the downstream system by the key we sent."),
        OperatorAction("resolve_succeeded", "Resolve as succeeded", reconciliation.RESOLVE, resolve_succeeded,
                       refused=(ToolFailure,), reason=REASON_REQUIRED, help_text="What you checked.",
                       extra_fields={"downstream_reference": forms.CharField(
                           help_text="The downstream id of what was done, e.g. the payment id.")}),
        OperatorAction("resolve_failed", "Resolve as failed", reconciliation.RESOLVE, resolve_failed,
                       refused=(ToolFailure,), reason=REASON_REQUIRED, style="danger",
                       help_text="Definitely not done: what you checked. The agent may then retry with the same key."),
    ]

    def standing_out(self) -> Q:
        return Q(escalated_at__isnull=False)

    @admin.display(description="key (digest)")
    def key_digest(self, record: UnknownOutcomeQueue) -> str:
        return keys.key_digest(record.key)

    @admin.display(description="waiting", ordering="created_at")
    def waiting(self, record: UnknownOutcomeQueue) -> str:
        return age(record.created_at)

    @admin.display(description="needs a person", boolean=True)
    def needs_person(self, record: UnknownOutcomeQueue) -> bool:
        return record.escalated_at is not None

    @admin.display(description="last evidence")
    def last_evidence(self, record: UnknownOutcomeQueue) -> str:
        if not record.evidence:
            return "—"
        last = record.evidence[-1]
        summary = last.get("answer") or last.get("error") or last.get("note") or ""
        return format_html("<code>{}</code> {}", last.get("source", ""), str(summary)[:120])

    @admin.display(description="evidence")
    def evidence_json(self, record: UnknownOutcomeQueue) -> str:
        return pretty_json(record.evidence)

    @admin.display(description="story")
    def story(self, record: UnknownOutcomeQueue) -> str:
        return stories.render(record)
