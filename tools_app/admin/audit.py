from django.contrib import admin

from tools_app.admin.big_lists import DateRangeFilter, RecentValuesFilter, TenantFilter
from tools_app.admin.scoping import ListedFromReplica, ReadOnlyAdmin, TenantScopedAdmin
from tools_app.core.models import AuditArchive, AuditCheckpoint, AuditEvent, AuditSeal


@admin.register(AuditEvent)
class AuditEventAdmin(ListedFromReplica[AuditEvent], TenantScopedAdmin[AuditEvent], ReadOnlyAdmin[AuditEvent]):
    """Append-only: nobody adds, edits or deletes events here (the database refuses it too)."""

    list_display = ["id", "created_at", "tenant", "actor", "action", "object_type", "object_id", "reason", "seq"]
    list_filter = [("action", RecentValuesFilter), ("object_type", RecentValuesFilter), ("tenant", TenantFilter),
                   ("created_at", DateRangeFilter)]
    search_fields = ["actor", "object_id", "trace_id", "operation_id"]
    list_select_related = ["tenant"]
    ordering = ["-id"]


@admin.register(AuditSeal)
class AuditSealAdmin(ListedFromReplica[AuditSeal], ReadOnlyAdmin[AuditSeal]):
    list_display = ["last_seq", "first_seq", "events", "last_hash", "sealed_at"]


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ListedFromReplica[AuditCheckpoint], ReadOnlyAdmin[AuditCheckpoint]):
    """The ranges `verify_audit_log` found sound, newest first: written by the verification only."""

    list_display = ["last_seq", "first_seq", "events", "last_hash", "verified_at"]


@admin.register(AuditArchive)
class AuditArchiveAdmin(ListedFromReplica[AuditArchive], ReadOnlyAdmin[AuditArchive]):
    """The prefixes of the chain moved to files by the audit retention: with the hashes they link from and to,
    what `verify_audit_log --archive <path>` checks a file against. Written by the archiver only."""

    list_display = ["last_seq", "first_seq", "events", "first_prev_hash", "last_hash", "path", "archived_at"]
