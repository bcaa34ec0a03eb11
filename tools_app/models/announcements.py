from django.db import models


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
