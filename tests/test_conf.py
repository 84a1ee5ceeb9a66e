"""The CHATPARITY settings: one typed accessor over the defaults."""

import pytest
from django.test import override_settings

from chatparity.conf import DEFAULTS, AppSettings, Setting, app_settings


def test_every_default_has_a_typed_attribute():
    declared = {name for name, value in vars(AppSettings).items() if isinstance(value, Setting)}
    assert declared == set(DEFAULTS)


def test_unset_settings_read_their_default():
    with override_settings(CHATPARITY={}):
        assert DEFAULTS["CACHE_SECONDS"] == app_settings.CACHE_SECONDS


def test_a_dict_setting_is_merged_over_its_default():
    with override_settings(CHATPARITY={"MAX_N": {"openai": 16}}):
        assert {**DEFAULTS["MAX_N"], "openai": 16} == app_settings.MAX_N


def test_site_values_are_read_on_every_access():
    with override_settings(CHATPARITY={"LOG_BODIES": True}):
        assert app_settings.LOG_BODIES is True
    assert app_settings.LOG_BODIES is False


def test_unknown_names_are_an_attribute_error():
    with pytest.raises(AttributeError):
        app_settings.NO_SUCH_SETTING  # noqa: B018
