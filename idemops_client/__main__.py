"""`python -m idemops_client proxy ...`: the same as the `idemops-client` command."""

import sys

from idemops_client.cli import main

sys.exit(main())
