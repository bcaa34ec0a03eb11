import json

from django.core.management.base import BaseCommand, CommandError

from tools_app import reconciliation
from tools_app.models import IdempotencyRecord, RecordStatus


class Command(BaseCommand):
    help = ("Expire dead executors' leases (PROCESSING → UNKNOWN) and reconcile UNKNOWN records that are due: "
            "what the periodic job does, on demand.")

    def add_arguments(self, parser):
        parser.add_argument("--record", type=int, help="Reconcile this UNKNOWN record now, due or not.")

    def handle(self, record=None, **options):
        if record is None:
            self.stdout.write(json.dumps(reconciliation.run_periodic()))
            return
        try:
            target = IdempotencyRecord.objects.get(pk=record, status=RecordStatus.UNKNOWN)
        except IdempotencyRecord.DoesNotExist:
            raise CommandError(f"no UNKNOWN record {record}") from None
        self.stdout.write(reconciliation.reconcile(target, actor="system:reconcile-command"))
