"""The `idemops` command: the platform's management commands with its own settings, so an installed
platform needs no manage.py (`idemops serve`, `idemops migrate`, `idemops check --deploy`,
`idemops create_tenant`, `idemops verify_audit_log`...). `python -m idemops` is the same command."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> None:
    # An adopter's own settings module (one that imports idemops.settings and adds to it) wins.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")
    from django.core.management import execute_from_command_line

    argv = list(sys.argv if argv is None else argv)
    argv[0] = "idemops"
    execute_from_command_line(argv)


if __name__ == "__main__":
    main()
