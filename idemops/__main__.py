"""`python -m idemops ...`: the `idemops` command (idemops.cli)."""

from idemops.cli import main

main()
