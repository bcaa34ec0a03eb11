from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app.access import auditors
from tools_app.access.models import Tenant


class Command(BaseCommand):
    help = "Issue an auditor key for the REST API, granted to the given tenants (printed once, stored as a digest)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who holds the key (a person or an audit system).")
        parser.add_argument("--tenant", action="append", required=True, dest="tenant_slugs",
                            help="A tenant the key may read; repeat for several.")

    def handle(self, name: str, tenant_slugs: list[str], **options: Any) -> None:
        found = list(Tenant.objects.filter(slug__in=tenant_slugs))
        missing = sorted(set(tenant_slugs) - {t.slug for t in found})
        if missing:
            raise CommandError(f"no tenant {', '.join(missing)}")
        _, raw = auditors.issue_key(name, found, actor="system:issue-auditor-key")
        self.stderr.write(f"Auditor key {name!r} for {', '.join(sorted(tenant_slugs))} (shown once):")
        self.stdout.write(raw)
