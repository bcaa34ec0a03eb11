from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app.core import audit_partitions


class Command(BaseCommand):
    help = ("Create the audit table's month partitions from this month to IDEMOPS_AUDIT_PARTITION_MONTHS_AHEAD "
            "months ahead (the daily job audit.partitions does it too), then list every partition and its events.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--ahead", type=int, help="months ahead to create (default: the setting)")

    def handle(self, **options: Any) -> None:
        if options["ahead"] is not None and options["ahead"] < 0:
            raise CommandError("--ahead must be 0 or more")
        ensured = audit_partitions.ensure(months_ahead=options["ahead"])
        for name in ensured.created:
            self.stdout.write(f"created {name}")
        for name in ensured.busy:
            self.stderr.write(f"not created now, the table was held past the lock timeout: {name}")
        for partition, events in audit_partitions.counts():
            bounds = (f"{partition.start:%Y-%m-%d} .. {partition.end:%Y-%m-%d}" if partition.start and partition.end
                      else "default")
            self.stdout.write(f"{partition.name}  {bounds}  {events} events")
        if ensured.blocked:
            raise CommandError(f"not created, their months' events are in {audit_partitions.DEFAULT}: "
                               f"{', '.join(ensured.blocked)} (docs/audit-log.md)")
