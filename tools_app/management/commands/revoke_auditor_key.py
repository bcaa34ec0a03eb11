from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app.access import auditors
from tools_app.access.models import AuditorKey


class Command(BaseCommand):
    help = "Revoke an auditor key by name; it answers 401 from then on."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--reason", default="")

    def handle(self, name: str, reason: str, **options: Any) -> None:
        try:
            key = AuditorKey.objects.get(name=name)
        except AuditorKey.DoesNotExist:
            raise CommandError(f"no auditor key {name!r}") from None
        if not auditors.revoke_key(key, actor="system:revoke-auditor-key", reason=reason):
            raise CommandError(f"auditor key {name!r} was already revoked")
        self.stdout.write(f"Auditor key {name!r} revoked.")
