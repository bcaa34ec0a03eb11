"""`python -m tools_app.conf [app ...]` (apps say `python -m idemops.conf`) writes docs/settings.md to standard output
(`make settings-doc`): the platform's settings, then each named app's own (its `idemops_settings` module)."""

import sys

from tools_app.conf.apps import discover
from tools_app.conf.words import markdown

sys.stdout.write(markdown(discover(sys.argv[1:])))
