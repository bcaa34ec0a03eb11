"""`idemops resume`: end an operator's pause (see `idemops pause`), audited on the operator's authority."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app import incidents
from tools_app.core.errors import InvalidInput, PermissionDenied
from tools_app.management.commands.pause import add_target_arguments, operator, target_of


class Command(BaseCommand):
    help = "End the pause of a tool, a downstream system or a tenant's writes: calls run again."

    def add_arguments(self, parser: CommandParser) -> None:
        add_target_arguments(parser, "Resume")
        parser.add_argument("--reason", default="", help="Why (kept in the audit log). Optional.")

    def handle(self, *args: Any, **options: Any) -> None:
        scope, target = target_of(options, known=False)
        user = operator(options["user"])
        try:
            resumed = incidents.resume(scope, target, user, reason=options["reason"])
        except (InvalidInput, PermissionDenied) as refused:
            raise CommandError(f"not resumed: {refused.message}") from None
        if not resumed:
            raise CommandError(f"{scope} {target} was not paused")
        self.stdout.write(f"resumed {scope} {target}: calls run again")
