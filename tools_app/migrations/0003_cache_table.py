"""The table of the shared cache (settings.CACHES, Django's DatabaseCache), so that `migrate` is
the only step a deployment runs: no separate `createcachetable` to forget."""

from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    # Idempotent: an existing table is left as it is.
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("tools_app", "0002_audit_append_only")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop, elidable=False)]
