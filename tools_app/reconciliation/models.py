"""The operators' queue of UNKNOWN outcomes: a proxy over the idempotency records."""

from tools_app.engine.models import IdempotencyRecord


class UnknownOutcomeQueue(IdempotencyRecord):
    """The operators' queue of UNKNOWN records (same table, its own admin page)."""

    class Meta:
        proxy = True
        verbose_name = "UNKNOWN outcome"
        ordering = ["created_at"]
