from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app.access import roles
from tools_app.access.models import Tenant


class Command(BaseCommand):
    help = "Give a user an operator role (operator, approver, auditor) on some tenants; makes the user staff."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("role", choices=sorted(roles.ROLE_PERMISSIONS))
        parser.add_argument("--tenant", action="append", default=[], help="Tenant slug; repeat for several.")

    def handle(self, username: str, role: str, tenant: list[str], **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}; create it first (manage.py createsuperuser or the admin)")
        if unknown := set(tenant) - set(Tenant.objects.filter(slug__in=tenant).values_list("slug", flat=True)):
            raise CommandError(f"no tenant {', '.join(sorted(unknown))}")
        roles.grant(user, role, tenant, actor="system:grant-role")
        self.stdout.write(f"{username} is now {role} on {', '.join(tenant) or 'no tenant yet'}")
