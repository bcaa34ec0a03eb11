"""Records' arguments and results: personal values stored encrypted (core.personal). The column stays jsonb:
the field encrypts and opens values, the schema does not change."""

from django.db import migrations

import tools_app.core.personal


class Migration(migrations.Migration):
    dependencies = [("tools_app", "0015_i36_bulk_actions")]

    operations = [
        migrations.AlterField(
            model_name="idempotencyrecord", name="arguments",
            field=tools_app.core.personal.PersonalJSONField(
                default=dict, help_text="The business arguments (canonical form; personal values encrypted: "
                                        "core.personal).")),
        migrations.AlterField(
            model_name="idempotencyrecord", name="result",
            field=tools_app.core.personal.PersonalJSONField(
                blank=True, null=True, help_text="What the first call returned; replays return it (personal values "
                                                 "encrypted).")),
    ]
