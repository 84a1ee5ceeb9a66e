"""``chatparity.dashboard`` as an app: ``manage.py check`` names what its live tail needs
beside it (channels installed, a default channel layer)."""

from django.core.checks import run_checks
from django.test import modify_settings, override_settings


def dashboard_errors():
    return sorted(
        (message.id, message.msg)
        for message in run_checks()
        if message.id.startswith("chatparity_dashboard.")
    )


def test_with_channels_and_a_layer_there_is_nothing_to_report():
    assert dashboard_errors() == []


def test_without_channels_installed_it_is_an_error_naming_it():
    with modify_settings(INSTALLED_APPS={"remove": ["channels"]}):
        assert dashboard_errors() == [
            (
                "chatparity_dashboard.E001",
                "chatparity.dashboard needs 'channels' in INSTALLED_APPS.",
            )
        ]


def test_without_a_default_channel_layer_it_is_an_error():
    message = (
        "chatparity.dashboard needs CHANNEL_LAYERS with a 'default' layer: the live tail is"
        " sent through it."
    )
    with override_settings(CHANNEL_LAYERS={}):
        assert dashboard_errors() == [("chatparity_dashboard.E002", message)]
    with override_settings():
        from django.conf import settings

        del settings.CHANNEL_LAYERS
        assert dashboard_errors() == [("chatparity_dashboard.E002", message)]
