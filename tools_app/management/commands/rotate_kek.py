from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app.core import keystore


class Command(BaseCommand):
    help = ("Wrap every data key of the key store again under the current key-encryption key (IDEMOPS_KEK), "
            "opening those the former one wrapped with IDEMOPS_KEK_PREVIOUS; no value is re-encrypted and writers "
            "never wait. With --check, only verify that the configured keys open every live data key "
            "(exits with status 1 if one does not).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="Verify only; change nothing.")

    def handle(self, check: bool, **options: Any) -> None:
        try:
            if check:
                live = keystore.verify_kek()
                self.stdout.write(self.style.SUCCESS(f"OK: the key-encryption keys open all {live} live data keys"))
                return
            rewrapped = keystore.rotate()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        counts = keystore.counts()
        self.stdout.write(self.style.SUCCESS(
            f"OK: {rewrapped} data keys wrapped again under IDEMOPS_KEK ({counts['live']} live, "
            f"{counts['destroyed']} destroyed); IDEMOPS_KEK_PREVIOUS may now be emptied"))
