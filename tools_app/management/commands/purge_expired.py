"""`manage.py purge_expired`: purge now what is past its retention (the schedule does it every
IDEMOPS_RETENTION_PURGE_MINUTES)."""

from django.core.management.base import BaseCommand

from tools_app import retention


class Command(BaseCommand):
    help = "Purge records' arguments and results, tasks' data, checkpoints and documents past their retention."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=None, help="rows per transaction "
                                                                    "(default: IDEMOPS_RETENTION_PURGE_BATCH)")

    def handle(self, batch, **options):
        report = retention.purge(batch=batch)
        for kind, count in report.purged.items():
            self.stdout.write(f"{kind}: {count}")
        self.stdout.write(f"batches: {report.batches}")
