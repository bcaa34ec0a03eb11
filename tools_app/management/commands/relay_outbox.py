import dataclasses
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tools_app import outbox


class Command(BaseCommand):
    help = "Deliver due outbox events (what the relay job does), on demand."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None)
        parser.add_argument("--one-batch", action="store_true", help="Deliver one batch, then stop.")

    def handle(self, batch_size: int | None = None, one_batch: bool = False, **options: Any) -> None:
        if one_batch:
            report = outbox.relay_batch(batch_size)
            result = dataclasses.asdict(report)
        else:
            result = outbox.relay_pending()
        self.stdout.write(json.dumps(result))
