"""Personal values stored encrypted (core.personal): records' arguments, results and evidence, approval requests'
arguments, outbox payloads, tasks' arguments, results and answers, step batches' outputs, task events' payloads,
scheduled operations' arguments. The columns stay jsonb: the field encrypts and opens values, the schema does not
change."""

from django.db import migrations

import tools_app.core.personal


class Migration(migrations.Migration):
    dependencies = [("tools_app", "0019_i42_versions_waits")]

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
        migrations.AlterField(
            model_name='approvalrequest',
            name='arguments',
            field=tools_app.core.personal.PersonalJSONField(help_text='The validated call arguments, re-validated when the approved call runs (personal values encrypted: core.personal).'),
        ),
        migrations.AlterField(
            model_name='idempotencyrecord',
            name='evidence',
            field=tools_app.core.personal.PersonalJSONField(blank=True, default=list, help_text='What was asked downstream, what came back, when; newest last.'),
        ),
        migrations.AlterField(
            model_name='outboxevent',
            name='payload',
            field=tools_app.core.personal.PersonalJSONField(help_text='What is delivered (personal values encrypted: core.personal).'),
        ),
        migrations.AlterField(
            model_name='scheduledoperation',
            name='arguments',
            field=tools_app.core.personal.PersonalJSONField(default=dict, help_text="The call's arguments, without its idempotency_key (personal values encrypted: core.personal)."),
        ),
        migrations.AlterField(
            model_name='stepbatch',
            name='output',
            field=tools_app.core.personal.PersonalJSONField(),
        ),
        migrations.AlterField(
            model_name='task',
            name='arguments',
            field=tools_app.core.personal.PersonalJSONField(help_text="The tool's validated arguments, as they may be shown (URLs without their query)."),
        ),
        migrations.AlterField(
            model_name='task',
            name='input_request',
            field=tools_app.core.personal.PersonalJSONField(blank=True, help_text='What a paused step asks for: {key: {message, schema}}.', null=True),
        ),
        migrations.AlterField(
            model_name='task',
            name='result',
            field=tools_app.core.personal.PersonalJSONField(blank=True, help_text="The tool's result, once succeeded.", null=True),
        ),
        migrations.AlterField(
            model_name='task',
            name='resume_input',
            field=tools_app.core.personal.PersonalJSONField(blank=True, help_text='The answer given when resuming.', null=True),
        ),
        migrations.AlterField(
            model_name='taskevent',
            name='payload',
            field=tools_app.core.personal.PersonalJSONField(blank=True, null=True),
        ),
        migrations.AlterModelOptions(
            name="idempotencyrecord",
            options={"permissions": [
                ("resolve_unknown", "Can resolve UNKNOWN outcomes"),
                ("force_expire_idempotencyrecord", "Can force-expire an idempotency key"),
                ("release_held_key", "Can release an idempotency key held past its retention"),
                ("view_personal_values", "Can see the personal values of calls in the console (others see [personal])"),
            ]},
        ),
    ]
