from tools_app.core.models import MetricMinute


class Dashboard(MetricMinute):
    """The operators' dashboard page in the admin (tools_app.admin.dashboard); its view permission gates it."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
