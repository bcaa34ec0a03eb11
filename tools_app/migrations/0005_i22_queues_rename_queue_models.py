# The two queue proxies took the names of the failures UnknownOutcome and PendingApproval; they are
# the console's queues, so they are called that. A proxy has no table: RenameModel changes only the
# state, and Django's contenttypes renames the content type after it (the admin's history follows).
# The permissions keep their rows but not their codenames, which Django derives from the model name:
# renamed here, so a role's or a person's grant stays the same row, and post_migrate finds nothing
# missing to create beside it.

from django.db import migrations

RENAMED = {"unknownoutcome": "unknownoutcomequeue", "pendingapproval": "approvalqueue"}
ACTIONS = ["add", "change", "delete", "view"]


def rename_permissions(apps, schema_editor, renamed):
    Permission = apps.get_model("auth", "Permission")
    db = schema_editor.connection.alias
    for old, new in renamed.items():
        # The content type may carry either name by now (contenttypes renames it next to RenameModel,
        # before this runs forwards, after it backwards): match the app's rows by codename.
        for action in ACTIONS:
            Permission.objects.using(db).filter(
                content_type__app_label="tools_app", content_type__model__in=[old, new],
                codename=f"{action}_{old}",
            ).update(codename=f"{action}_{new}")


def forwards(apps, schema_editor):
    rename_permissions(apps, schema_editor, RENAMED)


def backwards(apps, schema_editor):
    rename_permissions(apps, schema_editor, {new: old for old, new in RENAMED.items()})


class Migration(migrations.Migration):

    dependencies = [
        ('tools_app', '0004_i22_names_lowercase_statuses'),
        ('auth', '0012_alter_user_first_name_max_length'),
    ]

    operations = [
        migrations.RenameModel(old_name='UnknownOutcome', new_name='UnknownOutcomeQueue'),
        migrations.RenameModel(old_name='PendingApproval', new_name='ApprovalQueue'),
        migrations.RunPython(forwards, backwards),
    ]
