import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app import reconciliation
from tools_app.access import second_factor
from tools_app.core.errors import ToolFailure
from tools_app.engine.models import IdempotencyRecord


class Command(BaseCommand):
    help = ("Expire dead executors' leases (PROCESSING → UNKNOWN) and reconcile UNKNOWN records that are due: "
            "what the periodic job does, on demand. With --record, an operator reconciles one record now.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--record", type=int, help="Reconcile this UNKNOWN record now, due or not (needs --user).")
        parser.add_argument("--user", help="The operator reconciling --record: needs the resolve_unknown "
                                           "permission on the record's tenant, like the admin's button.")

    def handle(self, record: int | None = None, user: str | None = None, **options: Any) -> None:
        if record is None:
            self.stdout.write(json.dumps(reconciliation.run_periodic()))
            return
        if not user:
            raise CommandError("--record needs --user: the operator on whose authority it is reconciled")
        operator = get_user_model().objects.filter(username=user).first()
        if operator is None:
            raise CommandError(f"no user {user!r}")
        # Whoever runs a command on the server is trusted with it already: no code to ask for here.
        second_factor.at_the_shell(operator)
        target = IdempotencyRecord.objects.filter(pk=record).first()
        if target is None:
            raise CommandError(f"no record {record}")
        try:
            self.stdout.write(reconciliation.reconcile(target, operator))
        except ToolFailure as refused:
            raise CommandError(f"not reconciled: {refused.message}") from None
