from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app import access
from tools_app.access.models import ApiToken
from tools_app.management.owners import existing_user


class Command(BaseCommand):
    help = ("Make a person the owner of an agent token (a token from before owners existed, or an agent "
            "handed to someone else). Audited.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant")
        parser.add_argument("name", help="The token's name (the agent identity).")
        parser.add_argument("owner", help="Username of the person now responsible for the agent.")
        parser.add_argument("--reason", default="")

    def handle(self, tenant: str, name: str, owner: str, reason: str, **options: Any) -> None:
        token = ApiToken.objects.select_related("tenant", "owner").filter(tenant__slug=tenant, name=name).first()
        if token is None:
            raise CommandError(f"no token {name!r} in tenant {tenant!r}")
        if access.set_owner(token, existing_user(owner), actor="system:set-token-owner", reason=reason):
            self.stdout.write(f"{token.tenant.slug}/{name} is now owned by {owner}")
        else:
            self.stdout.write(f"{token.tenant.slug}/{name} was already owned by {owner}")
