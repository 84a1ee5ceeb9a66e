from django.apps import AppConfig


class TracingConfig(AppConfig):
    name = "chatparity.tracing"
    label = "chatparity_tracing"
    verbose_name = "chatparity tracing"

    def ready(self) -> None:
        from .. import signals
        from .spans import Tracing

        if not any(isinstance(observer, Tracing) for observer in signals.observers):
            signals.observe(Tracing())
