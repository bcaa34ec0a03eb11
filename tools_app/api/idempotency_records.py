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
- the error class; the free-text error message only as tools_app.core.redaction
  gives it (withheld: a handler or a downstream system may quote input in
  it). Operators read both in the admin.
"""

from __future__ import annotations

import hashlib

import django_filters
from django.core.validators import RegexValidator
from django.db.models import BinaryField, CharField, Func, Value
from django.db.models.functions import Left
from rest_framework import serializers

from tools_app.api.endpoints import AuditorSerializer, AuditorViewSet, tenant_filter, time_range
from tools_app.core import keys, redaction
from tools_app.core.errors import ErrorClass
from tools_app.engine.models import IdempotencyRecord, RecordStatus

KEY_DIGEST_LENGTH = keys.KEY_DIGEST_LENGTH


class IdempotencyRecordSerializer(AuditorSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    key_digest = serializers.SerializerMethodField(
        help_text="First 16 hex digits of HMAC-SHA256(server secret, idempotency key), as the admin and the "
                  "logs show it: the key itself is never exported.")
    argument_names = serializers.SerializerMethodField(
        help_text="The business arguments the call carried (names only, sorted).")
    # Declared, not derived: a derived read-only field drops allow_blank, and
    # the schema would then reject the "" of a record that did not fail.
    error_class = serializers.ChoiceField(choices=ErrorClass.choices, allow_blank=True, read_only=True,
                                          help_text="What an agent could do about the failure; empty unless failed.")
    error_message = serializers.SerializerMethodField(
        help_text=f"`{redaction.WITHHELD}` when the record has a failure message (it may quote the caller's "
                  "data; operators read it in the admin), else empty.")

    class Meta:
        model = IdempotencyRecord
        fields = [
            "id", "operation_id", "tenant", "tool", "key_digest", "fingerprint", "argument_names", "status",
            "error_class", "error_message", "attempts", "actor", "trace_id", "created_at", "updated_at", "finished_at",
            "retry_not_before", "expires_at", "retired_at",
        ]
        read_only_fields = fields

    def get_key_digest(self, record: IdempotencyRecord) -> str:
        return keys.key_digest(record.key)

    def get_argument_names(self, record: IdempotencyRecord) -> list[str]:
        return sorted(record.field_digests)

    def get_error_message(self, record: IdempotencyRecord) -> str:
        return redaction.failure_text(record.error_message)


class HmacSha256Hex(Func):
    """HMAC-SHA256 of a text column under `secret`, as lowercase hex, in SQL.

    RFC 2104 spelled out with PostgreSQL's built-in sha256(), H((K^opad) || H((K^ipad) || m)),
    so the database needs no extension (pgcrypto's hmac()). It equals
    tools_app.core.keys.keyed_hash (a test holds them together).
    """

    output_field = CharField()

    def __init__(self, expression, secret: bytes):
        block = hashlib.sha256().block_size
        key = (hashlib.sha256(secret).digest() if len(secret) > block else secret).ljust(block, b"\0")
        pads = (bytes(b ^ 0x5C for b in key), bytes(b ^ 0x36 for b in key))
        super().__init__(*(Value(pad, output_field=BinaryField()) for pad in pads), expression)

    def as_sql(self, compiler, connection, **extra_context):
        (outer, outer_params), (inner, inner_params), (text, text_params) = (
            compiler.compile(e) for e in self.get_source_expressions())
        sql = f"ENCODE(SHA256({outer}::bytea || SHA256({inner}::bytea || CONVERT_TO({text}, 'UTF8'))), 'hex')"
        return sql, (*outer_params, *inner_params, *text_params)


class IdempotencyRecordFilter(django_filters.FilterSet):
    tenant = tenant_filter()
    tool = django_filters.CharFilter(help_text="Tool name, exactly (e.g. `create_order`).")
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
    created_after, created_before = time_range("created_at", "created")
    finished_after, finished_before = time_range("finished_at", "finished")

    class Meta:
        model = IdempotencyRecord
        fields: list[str] = []

    def filter_key_digest(self, queryset, name, value):
        # Computed per row of the (tenant-scoped, otherwise filtered) list: a scan, correct for any
        # secret; an indexed digest column would need rewriting whenever the secret changes.
        digest = Left(HmacSha256Hex("key", keys.key_digest_secret()), KEY_DIGEST_LENGTH)
        return queryset.annotate(_key_digest=digest).filter(_key_digest=value)


class IdempotencyRecordViewSet(AuditorViewSet):
    """Idempotency records: each business operation (tenant, tool, key) and what became of it."""

    # The stored arguments and result are never exported: don't even read them.
    queryset = IdempotencyRecord.objects.select_related("tenant").defer("arguments", "result")
    serializer_class = IdempotencyRecordSerializer
    filterset_class = IdempotencyRecordFilter
    export_name = "idempotency-records"
