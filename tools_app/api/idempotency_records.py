"""GET /api/v1/idempotency-records: one row per business operation.

What an auditor gets, and what not:
- the key only as `key_digest` (tools_app.core.keys.key_digest: HMAC-SHA256
  under the server's secret, the form the admin and logs use): enough to
  find the record of a key one holds (`?key_digest=`) and to match log
  lines, nothing of the key's text, which agents may build from personal
  data, and not reversible by hashing guesses;
- the `fingerprint` and the argument *names*, never their values, and no
  stored result: both may carry personal data (payees, recipients, bodies),
  and matching operations needs only the digest;
- its business attributes (the tool's declared, non-personal search fields: `attributes`,
  filterable with `?attribute=name=value`);
- the error class; the free-text error message only as tools_app.core.redaction
  gives it (withheld: a handler or a downstream system may quote input in
  it). Operators read both in the admin.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.core.validators import RegexValidator
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tools_app.access.models import Tenant
from tools_app.api.endpoints import AuditorSerializer, AuditorViewSet, tenant_filter, time_range
from tools_app.core import keys, redaction
from tools_app.core.errors import ErrorClass
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit.registry import all_tools

KEY_DIGEST_LENGTH = keys.KEY_DIGEST_LENGTH


class IdempotencyRecordSerializer(AuditorSerializer):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    key_digest = serializers.SerializerMethodField(
        help_text="First 16 hex digits of HMAC-SHA256(server secret, idempotency key), as the admin and the "
                  "logs show it: the key itself is never exported.")
    argument_names = serializers.SerializerMethodField(
        help_text="The business arguments the call carried (names only, sorted).")
    # Declared, not derived: a derived read-only field drops allow_blank, and
    # the schema would then reject the "" of a record that did not fail.
    error_class = serializers.ChoiceField(choices=ErrorClass.choices, allow_blank=True, read_only=True,
                                          help_text="What an agent could do about the failure; empty unless failed.")
    attributes = serializers.DictField(
        child=serializers.CharField(), read_only=True,
        help_text="The tool's declared search fields (non-personal business references, e.g. an order id), "
                  "from the arguments and the result, as text.")
    error_message = serializers.SerializerMethodField(
        help_text=f"`{redaction.WITHHELD}` when the record has a failure message (it may quote the caller's "
                  "data; operators read it in the admin), else empty.")

    class Meta:
        model = IdempotencyRecord
        fields = [
            "id", "operation_id", "tenant", "tool", "key_digest", "fingerprint", "argument_names", "status",
            "error_class", "error_message", "attributes", "attempts", "actor", "trace_id", "created_at", "updated_at",
            "finished_at",
            "retry_not_before", "expires_at", "retired_at",
        ]
        read_only_fields = fields

    def get_key_digest(self, record: IdempotencyRecord) -> str:
        return keys.key_digest(record.key)

    def get_argument_names(self, record: IdempotencyRecord) -> list[str]:
        return sorted(record.field_digests)

    def get_error_message(self, record: IdempotencyRecord) -> str:
        return redaction.failure_text(record.error_message)


class AttributesField(forms.Field):
    """`?attribute=name=value`, repeatable: every pair must match (a record's attributes contain them all)."""

    widget = forms.MultipleHiddenInput  # reads every value of the parameter

    def to_python(self, value: Any) -> dict[str, str]:
        pairs: dict[str, str] = {}
        for text in value or []:
            name, sep, wanted = str(text).partition("=")
            if not sep or not name.strip() or not wanted.strip():
                raise forms.ValidationError(f"{text!r}: write it as name=value, e.g. attribute=order_id=42")
            if name.strip() not in declared_search_fields():
                raise forms.ValidationError(
                    f"{name.strip()!r} is no tool's search field; declared: "
                    f"{', '.join(declared_search_fields()) or 'none'}")
            pairs[name.strip()] = wanted.strip()
        return pairs


def declared_search_fields() -> list[str]:
    return sorted({name for spec in all_tools() for name in spec.search_fields})


ATTRIBUTE_HELP = ("A business attribute, `name=value` (one of the tools' search fields, e.g. `order_id=42`); "
                  "repeat the parameter for several, all of which must match.")


# With a schema of its own, drf-spectacular takes the parameter's description from it.
@extend_schema_field({"type": "array", "items": {"type": "string", "pattern": "^[^=]+=.+$"},
                      "description": ATTRIBUTE_HELP})
class AttributesFilter(django_filters.Filter):  # type: ignore[misc]  # django-filter ships no types
    field_class = AttributesField

    def filter(self, queryset: QuerySet[IdempotencyRecord], value: dict[str, str]) -> QuerySet[IdempotencyRecord]:
        return queryset.filter(attributes__contains=value) if value else queryset


class IdempotencyRecordFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    tenant = tenant_filter()
    tool = django_filters.CharFilter(help_text="Tool name, exactly.")
    status = django_filters.MultipleChoiceFilter(
        choices=RecordStatus.choices, help_text="Record status; repeat the parameter for several.")
    error_class = django_filters.MultipleChoiceFilter(
        choices=ErrorClass.choices, help_text="Error class of a failed record; repeat the parameter for several.")
    actor = django_filters.CharFilter(help_text="Who called, exactly (e.g. `agent:acme/billing-bot`).")
    operation_id = django_filters.UUIDFilter(help_text="The operation id sent downstream.")
    trace_id = django_filters.CharFilter(help_text="The call's W3C trace id (32 hex digits), exactly.")
    key_digest = django_filters.CharFilter(
        method="filter_key_digest",
        validators=[RegexValidator(f"^[0-9a-f]{{{KEY_DIGEST_LENGTH}}}$", "16 lowercase hex digits")],
        help_text="The record's `key_digest` (as the admin and the logs show it), to find a key's record "
                  "without sending the key.")
    attribute = AttributesFilter(help_text=ATTRIBUTE_HELP)
    created_after, created_before = time_range("created_at", "created")
    finished_after, finished_before = time_range("finished_at", "finished")

    class Meta:
        model = IdempotencyRecord
        fields: list[str] = []

    def filter_key_digest(self, queryset: QuerySet[IdempotencyRecord], name: str, value: str
                          ) -> QuerySet[IdempotencyRecord]:
        return keys.with_key_digest(queryset, value)


class IdempotencyRecordViewSet(AuditorViewSet):
    """Idempotency records: each business operation (tenant, tool, key) and what became of it."""

    # The stored arguments and result are never exported: don't even read them.
    queryset = IdempotencyRecord.objects.select_related("tenant").defer("arguments", "result")
    serializer_class = IdempotencyRecordSerializer
    filterset_class = IdempotencyRecordFilter
    export_name = "idempotency-records"
