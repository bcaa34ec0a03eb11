from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app import access
from tools_app.access.models import Tenant
from tools_app.management.owners import OWNER_HELP, existing_user


class Command(BaseCommand):
    help = "Create a tenant and an API token for it; the token is printed once and never stored raw."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--token-name", default="agent", help="The agent identity the token stands for.")
        parser.add_argument("--owner", required=True, help=OWNER_HELP)

    def handle(self, slug: str, name: str, token_name: str, owner: str, **options: Any) -> None:
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"tenant {slug!r} exists; issue_token gives it another token")
        owner_user = existing_user(owner)
        tenant = access.create_tenant(slug, name, actor="system:create-tenant")
        _, raw = access.issue_token(tenant, token_name, owner=owner_user, actor="system:create-tenant")
        self.stdout.write(f"Tenant {tenant.slug} created. API token for {token_name!r}, owned by {owner} "
                          "(shown once):")
        self.stdout.write(raw)
