# The audit table becomes a PostgreSQL table partitioned by RANGE (created_at), a partition per month
# (tools_app/core/audit_partitions.py): the months from its oldest event to three months ahead, and a
# DEFAULT partition. PostgreSQL cannot partition a table in place, so this copies it: it renames the table,
# creates the partitioned one like it, moves every row across, drops the old one, then gives the new one the
# old one's indexes, foreign key and append-only trigger. It holds an ACCESS EXCLUSIVE lock on the table
# throughout: audited writes wait until it ends (docs/audit-log.md, "Upgrading").
#
# Two things change with it, as a partitioned table requires its unique indexes to hold the partition key:
# the primary key is (id, created_at) in the database (Django still uses id, which one identity sequence
# keeps unique), and seq loses its unique constraint for a plain index (audit_seq).

from datetime import UTC, datetime

from django.db import migrations, models

TABLE = "tools_app_auditevent"
OLD = f"{TABLE}_before_0011"
MONTHS_AHEAD = 3
TRIGGER = (f"CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
           "FOR EACH ROW EXECUTE FUNCTION tools_app_audit_event_guard()")


def _month(moment):
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def _next(start):
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def _rebuild(cursor, *, partitioned):
    cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    skip = ["tools_app_auditevent_pkey", "tools_app_auditevent_seq_key", "audit_seq"]
    cursor.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s "
                   "AND NOT indexname = ANY(%s)", [TABLE, skip])
    indexes = [row[0].replace(" ON ONLY ", " ON ") for row in cursor.fetchall()]
    cursor.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                   "WHERE conrelid = %s::regclass AND contype = 'f'", [TABLE])
    foreign_keys = cursor.fetchall()
    cursor.execute(f"SELECT min(created_at), statement_timestamp() FROM {TABLE}")
    oldest, now = cursor.fetchone()
    cursor.execute(f"SELECT pg_get_serial_sequence('{TABLE}', 'id')")
    cursor.execute(f"SELECT last_value FROM {cursor.fetchone()[0]}")
    (last_id,) = cursor.fetchone()  # ids handed out and rolled back are not handed out again

    cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {OLD}")
    cursor.execute(f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING IDENTITY)"
                   + (" PARTITION BY RANGE (created_at)" if partitioned else ""))
    if partitioned:
        start, last = _month(min(oldest or now, now)), _month(now)
        for _ in range(MONTHS_AHEAD):
            last = _next(last)
        while start <= last:
            cursor.execute(f"CREATE TABLE {TABLE}_y{start.year:04d}m{start.month:02d} PARTITION OF {TABLE} "
                           f"FOR VALUES FROM ('{start.isoformat()}') TO ('{_next(start).isoformat()}')")
            start = _next(start)
        cursor.execute(f"CREATE TABLE {TABLE}_default PARTITION OF {TABLE} DEFAULT")
    cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM {OLD}")
    cursor.execute(f"DROP TABLE {OLD}")  # its partitions, indexes, foreign key, trigger and sequence with it
    cursor.execute(f"SELECT pg_get_serial_sequence('{TABLE}', 'id')")
    (sequence,) = cursor.fetchone()
    cursor.execute(f"SELECT setval(%s, GREATEST((SELECT max(id) FROM {TABLE}), %s) + 1, false)",
                   [sequence, last_id])
    cursor.execute(f"ALTER SEQUENCE {sequence} RENAME TO {TABLE}_id_seq")

    if partitioned:
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id, created_at)")
        cursor.execute(f"CREATE INDEX audit_seq ON {TABLE} (seq)")
    else:
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id)")
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_seq_key UNIQUE (seq)")
    for name, definition in foreign_keys:
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} {definition}")
    for definition in indexes:
        cursor.execute(definition)
    cursor.execute(TRIGGER)
    cursor.execute(f"ANALYZE {TABLE}")  # autovacuum analyses partitions, never a partitioned table itself


def partition(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        _rebuild(cursor, partitioned=True)


def unpartition(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        _rebuild(cursor, partitioned=False)


class Migration(migrations.Migration):

    dependencies = [
        ('tools_app', '0010_i28b_big_list_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(partition, unpartition)],
            state_operations=[
                migrations.AlterField(
                    model_name='auditevent',
                    name='seq',
                    field=models.BigIntegerField(blank=True, editable=False, null=True),
                ),
                migrations.AddIndex(
                    model_name='auditevent',
                    index=models.Index(fields=['seq'], name='audit_seq'),
                ),
            ],
        ),
    ]
