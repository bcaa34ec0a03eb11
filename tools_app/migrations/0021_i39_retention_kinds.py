"""Issue 39: an app's retention kinds. RetentionOverride's `documents` column (a kind of the demo's)
becomes an entry of `app_kinds` (kind -> seconds), where every app's own kinds are kept; the values
already set move there."""

from django.db import migrations, models


def documents_to_app_kinds(apps, schema_editor):
    RetentionOverride = apps.get_model("tools_app", "RetentionOverride")
    for override in RetentionOverride.objects.filter(documents__isnull=False):
        override.app_kinds = {**override.app_kinds, "documents": override.documents.total_seconds()}
        override.save(update_fields=["app_kinds"])


def app_kinds_to_documents(apps, schema_editor):
    RetentionOverride = apps.get_model("tools_app", "RetentionOverride")
    for override in RetentionOverride.objects.filter(app_kinds__has_key="documents"):
        from datetime import timedelta

        override.documents = timedelta(seconds=override.app_kinds["documents"])
        override.save(update_fields=["documents"])


class Migration(migrations.Migration):
    dependencies = [("tools_app", "0020_i41_encryption")]

    operations = [
        migrations.AddField(
            model_name="retentionoverride",
            name="app_kinds",
            field=models.JSONField(blank=True, default=dict,
                                   help_text="Periods of the apps' own retention kinds, in seconds, by kind."),
        ),
        migrations.RunPython(documents_to_app_kinds, app_kinds_to_documents),
        migrations.RemoveField(model_name="retentionoverride", name="documents"),
    ]
