"""`idemops pause`: an operator pauses a tool, a downstream system or one tenant's writes from the
shell (`idemops resume` ends it), or lists the pauses and circuit breakers (`--list`). What the
console's "Downstream systems" page does: incidents.pause checks the operator's permission and
tenants and audits it; the shell stands in for the second factor (second_factor.at_the_shell)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app import incidents
from tools_app.access import second_factor
from tools_app.core.errors import InvalidInput, PermissionDenied
from tools_app.incidents.models import Downstream, Pause, PauseScope
from tools_app.toolkit import pause_targets


def add_target_arguments(parser: CommandParser, verb: str) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--tool", help=f"{verb} this tool (its name in the registry).")
    what.add_argument("--downstream", help=f"{verb} every tool of this downstream system.")
    what.add_argument("--tenant", help=f"{verb} this tenant's writes (its slug).")
    parser.add_argument("--user", help="The operator on whose authority: needs the pause_operations permission "
                                       "(and, for a tool or a downstream, every tenant), like the console's page.")


def target_of(options: dict[str, Any], *, known: bool = True) -> tuple[PauseScope, str]:
    """The scope and target the options name; with `known`, a tool or downstream idemops knows (a pause
    of anything else would hold nothing back; a resume may end the pause of a tool removed since)."""
    for scope in PauseScope:
        if options.get(scope.value):
            target = str(options[scope.value]).strip()
            try:
                return scope, pause_targets.check(scope, target) if known else target
            except InvalidInput as invalid:
                raise CommandError(invalid.message) from None
    raise CommandError("name what: --tool, --downstream or --tenant")


def operator(username: str | None) -> User:
    if not username:
        raise CommandError("--user is needed: the operator on whose authority it is done")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user {username!r}")
    # Whoever runs a command on the server is trusted with it already: no code to ask for here.
    return second_factor.at_the_shell(user)


class Command(BaseCommand):
    help = ("Pause a tool, a downstream system or a tenant's writes: calls answer transient with your reason, "
            "nothing runs and no run is counted, until `idemops resume`. --list: the pauses and circuit breakers.")

    def add_arguments(self, parser: CommandParser) -> None:
        add_target_arguments(parser, "Pause")
        parser.add_argument("--reason", default="", help="Why (the agents hear it). Required.")
        parser.add_argument("--list", action="store_true", help="List the pauses and the circuit breakers "
                                                                "not plainly closed; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            self.list_state()
            return
        scope, target = target_of(options)
        user = operator(options["user"])
        try:
            incidents.pause(scope, target, user, reason=options["reason"])
        except (InvalidInput, PermissionDenied) as refused:
            raise CommandError(f"not paused: {refused.message}") from None
        self.stdout.write(f"paused {scope} {target}: calls answer transient with the reason until "
                          f"`idemops resume --{scope} {target}`")

    def list_state(self) -> None:
        problem = incidents.snapshot(fresh=True).problem
        if problem:
            self.stderr.write(f"the breaker and pause state could not be read; calls run as normal: {problem}")
        for row in Pause.objects.select_related("tenant"):
            target = row.tenant.slug if row.tenant is not None else row.target
            self.stdout.write(f"paused {row.scope} {target} by {row.paused_by} since {row.paused_at:%Y-%m-%d %H:%M:%S}"
                              f"Z: {row.reason}")
        for downstream in Downstream.objects.all():
            probe = f"; next probe {downstream.next_probe_at:%Y-%m-%d %H:%M:%S}Z" if downstream.next_probe_at else ""
            last = f"; last failure: {downstream.last_failure}" if downstream.last_failure else ""
            self.stdout.write(f"breaker {downstream.name}: {downstream.state}, {downstream.failures} failure(s)"
                              f"{probe}{last}")
