"""`python -m idemops.conf` writes docs/settings.md to standard output (`make settings-doc`)."""

import sys

from idemops.conf.words import markdown

sys.stdout.write(markdown())
