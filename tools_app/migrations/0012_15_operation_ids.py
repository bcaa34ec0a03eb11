"""Operation ids issued before the call (PreparedOperation), and the operation id on tasks, approval
requests, outbox events and audit events.

Existing tasks, approval requests and outbox events take their record's operation_id. Existing
audit events keep none: they are append-only (migration 0004), and their hashes cover what they
held when sealed.
"""

import django.db.models.deletion
from django.db import migrations, models


BACKFILL = """
UPDATE tools_app_task AS t SET operation_id = r.operation_id
    FROM tools_app_idempotencyrecord AS r WHERE t.record_id = r.id;
UPDATE tools_app_approvalrequest AS a SET operation_id = r.operation_id
    FROM tools_app_idempotencyrecord AS r WHERE a.record_id = r.id;
UPDATE tools_app_outboxevent AS o SET operation_id = r.operation_id
    FROM tools_app_idempotencyrecord AS r WHERE o.record_id = r.id;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('tools_app', '0011_downstream_conflict_error_class'),
    ]

    operations = [
        migrations.CreateModel(
            name='PreparedOperation',
            fields=[
                ('operation_id', models.UUIDField(primary_key=True, serialize=False)),
                ('tool', models.CharField(help_text='The tool the id may be used with.', max_length=100)),
                ('fingerprint', models.CharField(help_text='SHA-256 of the canonical business arguments.', max_length=64)),
                ('field_digests', models.JSONField(default=dict, help_text='Digest per top-level argument, to name what differs.')),
                ('actor', models.CharField(blank=True, max_length=200)),
                ('created_at', models.DateTimeField()),
            ],
        ),
        migrations.AddField(
            model_name='approvalrequest',
            name='operation_id',
            field=models.UUIDField(blank=True, editable=False, help_text="Its record's operation_id.", null=True),
        ),
        migrations.AddField(
            model_name='auditevent',
            name='operation_id',
            field=models.UUIDField(blank=True, help_text="The operation the event belongs to (its idempotency record's operation_id), for events about records, tasks, approval requests and outbox events.", null=True),
        ),
        migrations.AddField(
            model_name='outboxevent',
            name='operation_id',
            field=models.UUIDField(blank=True, editable=False, help_text='The operation_id of the record that wrote it, if any; sent along.', null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='operation_id',
            field=models.UUIDField(blank=True, editable=False, help_text="Its record's operation_id: the id that names the operation everywhere.", null=True),
        ),
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(condition=models.Q(('operation_id__isnull', False)), fields=['operation_id'], name='audit_operation'),
        ),
        migrations.AddField(
            model_name='preparedoperation',
            name='record',
            field=models.ForeignKey(help_text='The prepare_operation call that issued it.', on_delete=django.db.models.deletion.PROTECT, related_name='prepared_operations', to='tools_app.idempotencyrecord'),
        ),
        migrations.AddField(
            model_name='preparedoperation',
            name='tenant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, to='tools_app.tenant'),
        ),
        migrations.AddIndex(
            model_name='preparedoperation',
            index=models.Index(fields=['tenant', 'tool', 'fingerprint'], name='prepared_tool_fingerprint'),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
