"""Issue 13: embeddings of document chunks (pgvector), with an HNSW index for cosine distance."""

import pgvector.django
from django.db import migrations, models

from tools_app.documents import vector_extension


def require_pgvector(apps, schema_editor):
    # Before CREATE EXTENSION, so a server without pgvector stops `migrate` with what to install.
    vector_extension.require(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ("tools_app", "0018_16_console"),
    ]

    operations = [
        migrations.RunPython(require_pgvector, migrations.RunPython.noop, elidable=False),
        pgvector.django.VectorExtension(),
        migrations.AddField(
            model_name="document",
            name="embedding_model",
            field=models.CharField(blank=True, help_text="The model that embedded its chunks (empty: not embedded yet).",
                                   max_length=100),
        ),
        migrations.AddField(
            model_name="documentchunk",
            name="embedding",
            field=pgvector.django.VectorField(blank=True, dimensions=256, null=True),
        ),
        migrations.AddField(
            model_name="documentchunk",
            name="embedded_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="documentchunk",
            index=pgvector.django.HnswIndex(ef_construction=64, fields=["embedding"], m=16,
                                            name="chunk_embedding_hnsw", opclasses=["vector_cosine_ops"]),
        ),
    ]
