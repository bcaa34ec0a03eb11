# Issue 36, item 6: a record keeps its tool's search fields (tools_app.toolkit: `search_fields`) as
# indexed attributes. Existing records have none ({}: the database default, so SQL that names no
# attributes, a bulk load, still inserts).

import django.contrib.postgres.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tools_app', '0013_i36_task_deadlines'),
    ]

    operations = [
        migrations.AddField(
            model_name='idempotencyrecord',
            name='attributes',
            field=models.JSONField(blank=True, db_default=models.Value({}, models.JSONField()), default=dict, help_text="The tool's search fields from the arguments (set when claimed) and the result (added when it succeeds): name -> value as text."),
        ),
        migrations.AddIndex(
            model_name='idempotencyrecord',
            index=django.contrib.postgres.indexes.GinIndex(fields=['attributes'], name='record_attributes', opclasses=['jsonb_path_ops']),
        ),
    ]
