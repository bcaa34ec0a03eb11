"""Django's PostgreSQL backend with a health check that costs no round trip (base.DatabaseWrapper).

Settings name it as the ENGINE of every database (idemops/settings.py)."""
