from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app.core import audit


class Command(BaseCommand):
    help = ("Recompute the audit log's hash chain and report the first broken link (an edited or deleted event). "
            "Exits with status 1 if the chain is broken.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seal", action="store_true", help="Seal committed events first, so they are checked too.")

    def handle(self, seal: bool, **options: Any) -> None:
        if seal:
            sealed = audit.seal()
            self.stdout.write(f"sealed {sealed.sealed} new events")
        report = audit.verify_chain()
        if not report.ok:
            raise CommandError(f"BROKEN at {report.broken} ({report.verified} events verified before it)")
        self.stdout.write(self.style.SUCCESS(
            f"OK: {report.verified} events verified; head seq {report.head_seq} hash {report.head_hash}; "
            f"{report.unsealed} events not sealed yet"))
