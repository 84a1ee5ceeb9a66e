"""``chatparity.api`` as an app: ``manage.py check`` names what it needs installed beside it."""

from django.core.checks import run_checks
from django.test import modify_settings


def check_ids():
    return [message.id for message in run_checks()]


def test_with_the_apps_it_needs_there_is_nothing_to_report():
    assert "chatparity_api.E001" not in check_ids()


def test_each_missing_app_is_an_error_naming_it():
    with modify_settings(
        INSTALLED_APPS={"remove": ["rest_framework.authtoken", "drf_spectacular"]}
    ):
        messages = [message for message in run_checks() if message.id == "chatparity_api.E001"]
    assert sorted(message.msg for message in messages) == [
        "chatparity.api needs 'drf_spectacular' in INSTALLED_APPS.",
        "chatparity.api needs 'rest_framework.authtoken' in INSTALLED_APPS.",
    ]
