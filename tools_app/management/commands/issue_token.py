from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app import access
from tools_app.access.models import Tenant
from tools_app.management.owners import OWNER_HELP, existing_user


class Command(BaseCommand):
    help = "Issue another API token for an existing tenant (printed once), owned by a person."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant")
        parser.add_argument("name", help="The agent identity the token stands for.")
        parser.add_argument("--owner", required=True, help=OWNER_HELP)

    def handle(self, tenant: str, name: str, owner: str, **options: Any) -> None:
        try:
            tenant_obj = Tenant.objects.get(slug=tenant)
        except Tenant.DoesNotExist:
            raise CommandError(f"no tenant {tenant!r}") from None
        _, raw = access.issue_token(tenant_obj, name, owner=existing_user(owner), actor="system:issue-token")
        self.stdout.write(raw)
