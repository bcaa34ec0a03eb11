"""The database refuses to edit or delete audit events (and seals).

The only UPDATE allowed on an audit event is sealing it once: setting seq,
prev_hash and hash on a row that has no seq yet, with every other column
unchanged. Seals are never updated or deleted. Someone who can disable
triggers (the table owner) can still tamper; `verify_audit_log` finds that.
TRUNCATE is not guarded: the test suite flushes tables between tests.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION tools_app_audit_event_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND to_jsonb(NEW) - 'seq' - 'prev_hash' - 'hash' = to_jsonb(OLD) - 'seq' - 'prev_hash' - 'hash' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit events are append-only: % refused on event %', TG_OP, OLD.id
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON tools_app_auditevent
    FOR EACH ROW EXECUTE FUNCTION tools_app_audit_event_guard();

CREATE FUNCTION tools_app_audit_seal_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit seals are append-only: % refused on seal %', TG_OP, OLD.id
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_seal_append_only BEFORE UPDATE OR DELETE ON tools_app_auditseal
    FOR EACH ROW EXECUTE FUNCTION tools_app_audit_seal_guard();
"""

BACKWARD = """
DROP TRIGGER audit_seal_append_only ON tools_app_auditseal;
DROP FUNCTION tools_app_audit_seal_guard();
DROP TRIGGER audit_event_append_only ON tools_app_auditevent;
DROP FUNCTION tools_app_audit_event_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("tools_app", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
