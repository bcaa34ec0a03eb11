"""The UNKNOWN-outcomes queue: records whose downstream outcome must be found out."""

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from tools_app import reconciliation
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.errors import ToolFailure
from tools_app.models import UnknownOutcome


class ResolutionForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), help_text="Why: what you checked.")
    downstream_reference = forms.CharField(required=False,
                                           help_text="For 'succeeded': the downstream id (e.g. the payment id).")


@admin.register(UnknownOutcome)
class UnknownOutcomeAdmin(TenantScopedAdmin, admin.ModelAdmin):
    list_display = ["id", "tenant", "tool", "age", "reconcile_attempts", "needs_person", "last_evidence"]
    list_filter = ["tool", "tenant", ("escalated_at", admin.EmptyFieldListFilter)]
    search_fields = ["=operation_id", "=downstream_key", "=trace_id"]
    ordering = ["created_at"]
    readonly_fields = [f.name for f in UnknownOutcome._meta.fields]
    actions = ["reconcile_now", "resolve_succeeded", "resolve_failed"]

    @admin.display(description="age")
    def age(self, record):
        return timesince(record.created_at, timezone.now())

    @admin.display(description="needs a person", boolean=True)
    def needs_person(self, record):
        return record.escalated_at is not None

    @admin.display(description="last evidence")
    def last_evidence(self, record):
        if not record.evidence:
            return "—"
        last = record.evidence[-1]
        summary = last.get("answer") or last.get("error") or last.get("note") or ""
        return format_html("<code>{}</code> {}", last.get("source", ""), str(summary)[:120])

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_resolve_permission(self, request):
        return request.user.has_perm("tools_app.resolve_unknown")

    @admin.action(description="Reconcile now (ask the downstream system)", permissions=["resolve"])
    def reconcile_now(self, request, queryset):
        actor = f"user:{request.user.get_username()}"
        for record in queryset:
            status = reconciliation.reconcile(record, actor=actor)
            self.message_user(request, f"Record {record.pk}: {status}")

    @admin.action(description="Resolve as succeeded (with a downstream reference)", permissions=["resolve"])
    def resolve_succeeded(self, request, queryset):
        return self._resolve(request, queryset, succeeded=True)

    @admin.action(description="Resolve as failed (definitely not done)", permissions=["resolve"])
    def resolve_failed(self, request, queryset):
        return self._resolve(request, queryset, succeeded=False)

    def _resolve(self, request, queryset, *, succeeded):
        form = ResolutionForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return TemplateResponse(request, "admin/tools_app/resolve_unknown.html", {
                **self.admin_site.each_context(request), "title": "Resolve UNKNOWN outcomes", "form": form,
                "records": queryset, "succeeded": succeeded, "opts": self.model._meta,
                "action": request.POST.get("action"),
                "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            })
        for record in queryset:
            try:
                reconciliation.resolve_by_operator(record, request.user, succeeded=succeeded,
                                                   reason=form.cleaned_data["reason"],
                                                   downstream_reference=form.cleaned_data["downstream_reference"])
            except ToolFailure as failure:
                self.message_user(request, f"Record {record.pk}: {failure.message}", messages.ERROR)
            else:
                self.message_user(request, f"Record {record.pk} resolved as {'succeeded' if succeeded else 'failed'}")
        return None
