from typing import Any

from django.core.management.base import BaseCommand

from tools_app.core import audit


class Command(BaseCommand):
    help = "Link every committed, unsealed audit event into the hash chain now (the periodic job does it each minute)."

    def handle(self, **options: Any) -> None:
        result = audit.seal()
        self.stdout.write(f"sealed {result.sealed} events; head seq {result.head_seq} hash {result.head_hash}")
