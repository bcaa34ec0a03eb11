from tools_app.models.metrics import CallEvent


class Dashboard(CallEvent):
    """The operators' dashboard page in the admin (tools_app.admin.dashboard); its view permission gates it."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
