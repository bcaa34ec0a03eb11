"""Documents ingested by the `ingest_document` task, searchable with PostgreSQL full-text search
and by meaning (pgvector: one embedding per chunk, an HNSW index for cosine distance)."""

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from pgvector.django import HnswIndex, VectorField

from idemops_demo.documents.embeddings import DIMENSIONS

# Fixed in the generated column below; search queries must use the same configuration.
SEARCH_CONFIG = "english"


class Document(models.Model):
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="documents")
    task = models.OneToOneField(
        "tools_app.Task", on_delete=models.PROTECT, related_name="document",
        help_text="The ingest task that built it: one task makes at most one document.")
    title = models.CharField(max_length=300)
    format = models.CharField(max_length=16)
    source = models.CharField(max_length=500, help_text="upload, or the allowed path or URL it was read from.")
    content_sha256 = models.CharField(max_length=64, help_text="Of the bytes received.")
    characters = models.PositiveIntegerField()
    chunk_count = models.PositiveIntegerField()
    summary = models.TextField(blank=True)
    created_at = models.DateTimeField()
    ready_at = models.DateTimeField(null=True, blank=True, help_text="Set when the summary is written.")
    embedding_model = models.CharField(max_length=100, blank=True,
                                       help_text="The model that embedded its chunks (empty: not embedded yet).")

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"], name="document_tenant_created")]

    def __str__(self) -> str:
        return self.title


class DocumentChunk(models.Model):
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    seq = models.PositiveIntegerField()
    text = models.TextField()
    search = models.GeneratedField(
        expression=SearchVector("text", config=SEARCH_CONFIG),
        output_field=SearchVectorField(),
        db_persist=True,
    )
    # Written by the embed step, a batch of chunks per transaction; NULL until then, so a resumed
    # step embeds only what is still NULL.
    embedding = VectorField(dimensions=DIMENSIONS, null=True, blank=True)
    embedded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["document", "seq"]
        constraints = [models.UniqueConstraint(fields=["document", "seq"], name="one_chunk_per_position")]
        indexes = [GinIndex(fields=["search"], name="chunk_search_gin"),
                   HnswIndex(name="chunk_embedding_hnsw", fields=["embedding"], m=16, ef_construction=64,
                             opclasses=["vector_cosine_ops"])]
