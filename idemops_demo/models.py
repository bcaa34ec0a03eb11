"""The business objects the demo write tools create.

Each points at the idempotency record that created it through a one-to-one
field: besides linking an order to its call, the unique constraint is a
second, business-level guard that one operation creates one object.
"""

from django.db import models

from idemops_demo.documents.models import Document, DocumentChunk  # noqa: F401  (the app's models, found here)


class Order(models.Model):
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="orders")
    record = models.OneToOneField(
        "tools_app.IdempotencyRecord", on_delete=models.PROTECT, related_name="order", null=True, blank=True
    )
    customer = models.CharField(max_length=200)
    currency = models.CharField(max_length=3)
    total = models.DecimalField(max_digits=14, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Order {self.pk} ({self.customer}, {self.total} {self.currency})"


class OrderLine(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    sku = models.CharField(max_length=64)
    quantity = models.PositiveIntegerField()
    unit_price = models.DecimalField(max_digits=12, decimal_places=2)

    class Meta:
        ordering = ["id"]


class Ticket(models.Model):
    class Priority(models.TextChoices):
        LOW = "low"
        NORMAL = "normal"
        HIGH = "high"
        URGENT = "urgent"

    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="tickets")
    record = models.OneToOneField(
        "tools_app.IdempotencyRecord", on_delete=models.PROTECT, related_name="ticket", null=True, blank=True
    )
    subject = models.CharField(max_length=200)
    body = models.TextField()
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    status = models.CharField(max_length=16, default="open")
    assignee = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"Ticket {self.pk}: {self.subject}"


class TicketNote(models.Model):
    """A note on a ticket (e.g. why `process_ticket_batch` closed it)."""

    ticket = models.ForeignKey(Ticket, on_delete=models.CASCADE, related_name="notes")
    body = models.TextField()
    task = models.ForeignKey("tools_app.Task", on_delete=models.PROTECT, null=True, blank=True,
                             related_name="ticket_notes", help_text="The batch task that wrote it.")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at", "id"]


class Customer(models.Model):
    """A customer onboarded by the `onboard_customer` saga (one task, one customer: the one-to-one
    `task` makes the create step idempotent)."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        CLOSED = "closed", "Closed (onboarding undone)"

    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="customers")
    task = models.OneToOneField("tools_app.Task", on_delete=models.PROTECT, related_name="customer")
    name = models.CharField(max_length=200)
    email = models.EmailField()
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.ACTIVE)
    mandate_id = models.CharField(max_length=100, blank=True, help_text="The payment gateway's mandate.")
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class Announcement(models.Model):
    """A published announcement (the effect of the `publish_announcement` tool)."""

    class Audience(models.TextChoices):
        STAFF = "staff"
        EVERYONE = "everyone"

    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="announcements")
    record = models.OneToOneField(
        "tools_app.IdempotencyRecord", on_delete=models.PROTECT, related_name="announcement", null=True, blank=True)
    title = models.CharField(max_length=200)
    body = models.TextField()
    audience = models.CharField(max_length=8, choices=Audience.choices)
    published_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-published_at", "-id"]

    def __str__(self) -> str:
        return self.title
