"""WSGI entry point (admin and API only; /mcp needs the ASGI app)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")
application = get_wsgi_application()
