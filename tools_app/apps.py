from django.apps import AppConfig


class ToolsAppConfig(AppConfig):
    name = "tools_app"
    verbose_name = "idemops"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing the tools registers them (one declaration per tool).
        from django.db.models.signals import post_migrate
        from django_q.signals import post_spawn

        from tools_app import tools  # noqa: F401
        from tools_app.roles import ensure_roles
        from tools_app.schedules import ensure_schedules, start_loops

        post_migrate.connect(ensure_schedules, sender=self)
        post_migrate.connect(ensure_roles, sender=self)
        # Every django-q2 worker process runs the few-second loops (tools_app.schedules).
        post_spawn.connect(start_loops, dispatch_uid="idemops-loops")
