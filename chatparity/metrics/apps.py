from django.apps import AppConfig
from django.core.checks import register


class MetricsConfig(AppConfig):
    name = "chatparity.metrics"
    label = "chatparity_metrics"
    verbose_name = "chatparity metrics"

    def ready(self) -> None:
        from .. import signals
        from .checks import check_metrics_settings
        from .instruments import Metrics

        register(check_metrics_settings)
        if not any(isinstance(observer, Metrics) for observer in signals.observers):
            signals.observe(Metrics())
