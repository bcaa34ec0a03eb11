from datetime import timedelta

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "idemops_demo"
    verbose_name = "Business objects (demo)"
    default_auto_field = "django.db.models.BigAutoField"
    # What the platform's roles may see of this app's objects (tools_app.access.roles).
    idemops_role_permissions = {
        "operator": ["view_order", "view_ticket", "view_announcement", "view_customer", "view_document"],
        "approver": ["view_order", "view_ticket", "view_announcement"],
    }

    def idemops_processes(self, python: str) -> list[tuple[str, list[str]]]:
        """The demo's downstream systems, each with its own database on the platform's server, for
        `manage.py serve` to start beside the platform (unless IDEMOPS_RUN_DEMO_DOWNSTREAMS is off)."""
        from psycopg.conninfo import make_conninfo

        from idemops.conf import conf
        from idemops_demo.idemops_settings import DemoSettings

        if not DemoSettings.current().run_demo_downstreams:
            return []
        # idemops/settings.py sets it at start-up (to the embedded server's when DATABASE_URL is unset).
        url = conf().database_url
        if url is None:
            raise RuntimeError("the platform's database URL was not resolved at start-up")
        return [
            ("payment-gateway", [python, "-m", "idemops_demo.downstream.payment_gateway", "--port", "8001",
                                 "--database-url", make_conninfo(url, dbname="payment_gateway")]),
            ("notification-sink", [python, "-m", "idemops_demo.downstream.notification_sink", "--port", "8002",
                                   "--smtp-port", "8025", "--database-url",
                                   make_conninfo(url, dbname="notification_sink")]),
        ]

    def ready(self) -> None:
        from django.core import checks

        from idemops.tools import register_retained
        from idemops_demo import documents
        from idemops_demo.idemops_settings import DemoSettings

        # `migrate` (and `check --database default`) stop on a server without pgvector, saying so.
        checks.register(documents.check_pgvector, checks.Tags.database)
        # The demo's own retention kind: documents, with their chunks and vectors, kept
        # IDEMOPS_RETENTION_DOCUMENTS_HOURS (its own setting) unless a tool (KeepFor(kinds=...)) or a tenant says.
        register_retained("documents", model=documents.Document, tool="task__tool", since="created_at",
                          purge=documents.purge_documents, action="document.purged",
                          default=lambda: timedelta(hours=DemoSettings.current().retention_documents_hours),
                          description="Ingested documents, with their chunks and vectors, from their creation.")
