"""System checks of CHATPARITY["METRICS"]: a long token, networks that parse, a
multiprocess folder that exists, and a warning while nobody may scrape."""

import os
from unittest import mock

from django.test import SimpleTestCase, override_settings

from chatparity.metrics.checks import check_metrics_settings


def ids(**metrics):
    with override_settings(CHATPARITY={"METRICS": metrics}):
        return [message.id for message in check_metrics_settings()]


class MetricsChecksTests(SimpleTestCase):
    def test_a_long_token_or_valid_networks_pass(self):
        assert ids(TOKEN="x" * 16) == []
        assert ids(ALLOWED_NETWORKS=["10.0.0.0/8", "192.168.1.7", "fd00::/8"]) == []

    def test_nobody_allowed_is_a_warning(self):
        assert ids() == ["chatparity_metrics.W001"]

    def test_a_short_token_is_an_error(self):
        assert ids(TOKEN="short", ALLOWED_NETWORKS=["10.0.0.0/8"]) == ["chatparity_metrics.E001"]

    def test_networks_that_do_not_parse_are_errors(self):
        assert ids(TOKEN="x" * 16, ALLOWED_NETWORKS=["10.0.0.1/8"]) == ["chatparity_metrics.E002"]
        assert ids(TOKEN="x" * 16, ALLOWED_NETWORKS="10.0.0.0/8") == ["chatparity_metrics.E002"]

    def test_a_multiprocess_folder_that_is_missing_is_an_error(self):
        with mock.patch.dict(os.environ, {"PROMETHEUS_MULTIPROC_DIR": "/nonexistent/metrics"}):
            assert ids(TOKEN="x" * 16) == ["chatparity_metrics.E003"]
