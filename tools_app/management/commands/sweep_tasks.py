"""`manage.py sweep_tasks`: run the long-task sweep now (it also runs every minute on the cluster)."""

from typing import Any

from django.core.management.base import BaseCommand

from tools_app import tasks


class Command(BaseCommand):
    help = ("End tasks past their deadline, revive tasks whose worker died (lease expired) and queue due retries "
            "and lost jobs.")

    def handle(self, **options: Any) -> None:
        counts = tasks.sweep()
        self.stdout.write(f"expired leases: {counts['expired']}, requeued: {counts['requeued']}, "
                          f"past their deadline: {counts['past_deadline']}")
