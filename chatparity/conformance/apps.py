from django.apps import AppConfig


class ConformanceConfig(AppConfig):
    name = "chatparity.conformance"
    label = "chatparity_conformance"
    verbose_name = "chatparity conformance checker"
