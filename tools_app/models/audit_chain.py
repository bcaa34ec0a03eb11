from django.db import models


class AuditSeal(models.Model):
    """One run of the audit sealer: the chain's head after it.

    Append-only (a trigger refuses UPDATE and DELETE). The last seal says how
    long the chain must be, so deleting the newest events is detected too.
    """

    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField(unique=True)
    last_hash = models.CharField(max_length=64)
    events = models.PositiveIntegerField()
    sealed_at = models.DateTimeField()

    class Meta:
        ordering = ["-last_seq"]

    def __str__(self) -> str:
        return f"seal {self.first_seq}..{self.last_seq}"
