"""The Django app and its composition root: where the packages are wired together at start-up.

Lower packages (engine, toolkit) learn of the higher ones (approvals,
reconciliation, tasks), and tasks of its sibling outbox, only through the
hooks registered here. Importing
modules inside `ready` is Django's rule for app start-up (models are not
loaded when this module is imported), not a way around an import cycle.
"""

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ToolsAppConfig(AppConfig):
    name = "tools_app"
    verbose_name = "idemops"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate
        from django_q.signals import post_execute_in_worker, post_spawn, pre_enqueue, pre_execute

        from tools_app import (
            approvals,
            engine,
            outbox,
            reconciliation,
            tasks,
            toolkit,
            tools,  # importing the platform's tools registers them: one declaration each
        )
        from tools_app.access import logins
        from tools_app.access.roles import ensure_roles
        from tools_app.approvals import confirmations
        from tools_app.conf import conf
        from tools_app.core import jobs, tracing
        from tools_app.schedules import ensure_schedules, start_loops

        # Before Django builds its middleware chain (it instruments it) and before the first query.
        tracing.configure()

        engine.hooks.register(follow_awaiting_approval=approvals.follow,
                              settle_expired=reconciliation.settle_expired)
        toolkit.hooks.register(approval_gate=approvals.gate, run_long_tool=tasks.call_task_tool,
                               after_unknown=reconciliation.reconcile_soon, confirm=confirmations.confirm)
        tasks.hooks.register(enqueue_event=outbox.enqueue)
        # Importing registers the system check that refuses a deploy stranding unfinished tasks.
        from tools_app.tasks import versions  # noqa: F401
        # Every installed app's tools (its `idemops_tools` module), and the modules the settings name.
        tools.discover(conf().tool_modules)
        post_migrate.connect(ensure_schedules, sender=self)
        post_migrate.connect(ensure_roles, sender=self)
        logins.connect()  # failed logins and lockouts audited; a login's second factor noted
        # Every django-q2 worker process runs the few-second loops (tools_app.schedules).
        post_spawn.connect(start_loops, dispatch_uid="idemops-loops")
        # A job runs in the trace it was queued in (core.jobs).
        pre_enqueue.connect(jobs.carry_trace, dispatch_uid="idemops-trace-enqueue")
        pre_execute.connect(jobs.open_job_span, dispatch_uid="idemops-trace-execute")
        post_execute_in_worker.connect(jobs.close_job_span, dispatch_uid="idemops-trace-executed")


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """Django's admin, with the operators' console (tools_app.admin.site.ConsoleSite) as its site.
    Named in INSTALLED_APPS in place of django.contrib.admin."""

    default = False  # tools_app's own config (above) stays the default of this module
    default_site = "tools_app.admin.site.ConsoleSite"

    def ready(self) -> None:
        # Build the site from our admin package, before any other app's admin module touches it:
        # the site is created lazily by the first registration, and if that first registration
        # came from elsewhere, importing the site's module would run our registrations into a
        # site that is then replaced. (Django's start-up rule, like ToolsAppConfig.ready's imports.)
        import tools_app.admin  # noqa: F401

        super().ready()
