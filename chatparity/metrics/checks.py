"""System checks of ``CHATPARITY["METRICS"]`` and of prometheus-client's multiprocess folder."""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from django.core.checks import CheckMessage, Error, Warning

from ..conf import app_settings

MIN_TOKEN_LENGTH = 16


def check_metrics_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A token long enough, networks that parse, a multiprocess folder that exists;
    a warning when nobody may scrape."""
    messages: list[CheckMessage] = []
    setting = app_settings.METRICS
    token = setting.get("TOKEN")
    if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH):
        messages.append(
            Error(
                f'CHATPARITY["METRICS"]["TOKEN"] must be a string of at least'
                f" {MIN_TOKEN_LENGTH} characters.",
                hint="python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                id="chatparity_metrics.E001",
            )
        )
    networks = setting.get("ALLOWED_NETWORKS")
    if not isinstance(networks, list | tuple):
        messages.append(
            Error(
                'CHATPARITY["METRICS"]["ALLOWED_NETWORKS"] must be a list of networks.',
                id="chatparity_metrics.E002",
            )
        )
        networks = []
    for network in networks:
        try:
            ipaddress.ip_network(network)
        except (TypeError, ValueError):
            messages.append(
                Error(
                    f'CHATPARITY["METRICS"]["ALLOWED_NETWORKS"]: {network!r} is not a network'
                    " (an address, or CIDR like 10.0.0.0/8, host bits zero).",
                    id="chatparity_metrics.E002",
                )
            )
    if not token and not networks:
        messages.append(
            Warning(
                "Nobody may scrape /metrics: it answers 403 to every request.",
                hint='Set CHATPARITY["METRICS"]["TOKEN"] or ["ALLOWED_NETWORKS"].',
                id="chatparity_metrics.W001",
            )
        )
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        messages.append(
            Error(
                f"PROMETHEUS_MULTIPROC_DIR ({folder}) is not a folder this process can write.",
                hint="Create it (empty) before the workers start.",
                id="chatparity_metrics.E003",
            )
        )
    return messages
