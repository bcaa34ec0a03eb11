from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools_app import retention
from tools_app.conf import conf
from tools_app.core import audit


class Command(BaseCommand):
    end = 0
    help = ("Recompute the audit log's hash chain and report the first broken link (an edited or deleted event), "
            "resuming after the newest checkpoint and storing one after each sound range. "
            "Exits with status 1 if the chain is broken.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seal", action="store_true", help="Seal committed events first, so they are checked too.")
        parser.add_argument("--full", action="store_true",
                            help="Start again from the archived head (seq 1 if nothing is archived), recomputing what "
                                 "earlier checkpoints covered.")
        parser.add_argument("--from-seq", type=int, default=None,
                            help="First seq to check (default: just after the newest checkpoint).")
        parser.add_argument("--to-seq", type=int, default=None, help="Last seq to check (default: the chain's head).")
        parser.add_argument("--archive", type=Path, default=None,
                            help="Verify an archive file written by the purge instead (its chain, head to tail).")
        parser.add_argument("--checkpoint-every", type=int, default=None,
                            help="Events per checkpointed range (default IDEMOPS_AUDIT_VERIFY_CHECKPOINT_EVENTS).")

    def handle(self, seal: bool, full: bool, from_seq: int | None, to_seq: int | None,
               checkpoint_every: int | None, archive: Path | None, **options: Any) -> None:
        if archive is not None:
            check = retention.verify_archive_file(archive)
            if check.problem is not None:
                raise CommandError(f"BROKEN archive {archive}: {check.problem} ({check.events} events verified)")
            self.stdout.write(self.style.SUCCESS(
                f"OK: {check.events} archived events verified from {check.first_prev_hash} to {check.last_hash}"))
            return
        if seal:
            sealed = audit.seal()
            self.stdout.write(f"sealed {sealed.sealed} new events")
        head = audit.chain_head()[0]
        self.end = min(head, to_seq or head)
        report = audit.verify_incrementally(every=checkpoint_every or conf().audit_verify_checkpoint_events,
                                            from_seq=from_seq, to_seq=to_seq, full=full, progress=self.progress)
        if not report.ok:
            raise CommandError(f"BROKEN at {report.broken} ({report.verified} events verified before it)")
        self.stdout.write(self.style.SUCCESS(
            f"OK: {report.verified} events verified; head seq {report.head_seq} hash {report.head_hash}; "
            f"{report.unsealed} events not sealed yet"))

    def progress(self, report: audit.ChainReport, checkpointed: bool) -> None:
        if report.ok and report.verified:
            stored = " (checkpoint stored)" if checkpointed else ""
            # On stderr, as it happens (flushed: a pipe buffers); stdout keeps the one result line.
            self.stderr.write(f"verified up to seq {report.head_seq} of {self.end}{stored}")
            self.stderr.flush()
