from ..models import RequestLog


class UsageDashboard(RequestLog):
    """The request log seen as charts: the admin's usage dashboard."""

    class Meta:
        proxy = True
        verbose_name = "usage dashboard"
        verbose_name_plural = "usage dashboard"
