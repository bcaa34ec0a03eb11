"""`manage.py purge_expired`: purge now what is past its retention (the schedule does it every
IDEMOPS_RETENTION_PURGE_MINUTES)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tools_app import retention


class Command(BaseCommand):
    help = ("Purge records' arguments and results, tasks' data, checkpoints and documents past their retention, "
            "and archive audit events past theirs to files.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=None, help="rows per transaction "
                                                                    "(default: IDEMOPS_RETENTION_PURGE_BATCH)")

    def handle(self, batch: int | None, **options: Any) -> None:
        report = retention.purge(batch=batch)
        for kind, count in report.purged.items():
            self.stdout.write(f"{kind}: {count}")
        self.stdout.write(f"batches: {report.batches}")
