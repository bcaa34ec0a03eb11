# Issue 36, item 7: a long task has a deadline (tools_app.tasks.state.end_at_deadline). Tasks unfinished
# when this runs had none: they get the platform's (IDEMOPS_TASK_DEADLINE_SECONDS) from now, not from
# their start, so an upgrade never ends at once a task that was waiting within its rights.

from datetime import timedelta

from django.db import migrations, models
from django.db.models.functions import Now

UNFINISHED = ["created", "running", "paused", "retrying"]


def give_unfinished_tasks_a_deadline(apps, schema_editor):
    from tools_app.conf import conf

    allowed = timedelta(seconds=conf().task_deadline_seconds)
    apps.get_model("tools_app", "Task").objects.filter(status__in=UNFINISHED, deadline_at=None).update(
        time_allowed=allowed, deadline_at=Now() + allowed)


class Migration(migrations.Migration):

    dependencies = [
        ("tools_app", "0012_i36_incidents"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="deadline_at",
            field=models.DateTimeField(blank=True, help_text="Unfinished by then, it ends (failed, with the reason): set when it starts, and again when resume_task runs a failed task anew.", null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="time_allowed",
            field=models.DurationField(blank=True, help_text="How long it may take: its tool's deadline, or the shorter one its caller asked for.", null=True),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(condition=models.Q(("status__in", UNFINISHED)), fields=["deadline_at"], name="task_unfinished_deadline"),
        ),
        migrations.RunPython(give_unfinished_tasks_a_deadline, migrations.RunPython.noop),
    ]
