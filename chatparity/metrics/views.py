"""``GET /metrics``: the Prometheus exposition, for the scrapers the settings allow."""

from __future__ import annotations

import hmac
import ipaddress
import os

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ..accounting import spool
from ..conf import app_settings
from ..transport import health
from . import instruments


def allowed(request: HttpRequest) -> bool:
    """Whether ``request`` carries the scrape token, or comes from an allowed network."""
    setting = app_settings.METRICS
    token = setting.get("TOKEN")
    if token:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
            return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    networks = setting.get("ALLOWED_NETWORKS", ())
    return any(address in ipaddress.ip_network(network) for network in networks)


class _AtScrape(Collector):
    """What is read when scraped, once for the machine: the dependencies' health and
    the log rows waiting in the spool (left out when the spool cannot be read)."""

    def __init__(self, outcomes: dict[str, str], spooled: int | None) -> None:
        self.outcomes, self.spooled = outcomes, spooled

    def collect(self) -> list[Metric]:
        up = GaugeMetricFamily(
            "chatparity_dependency_up",
            "1 if the dependency answered the scrape's check in time, else 0.",
            labels=["dependency"],
        )
        for name, outcome in self.outcomes.items():
            up.add_metric([name], 1.0 if outcome == "ok" else 0.0)
        if self.spooled is None:
            return [up]
        spooled = GaugeMetricFamily(
            "chatparity_log_rows_spooled",
            "Log rows kept in this machine's spool until the database takes them.",
            value=self.spooled,
        )
        return [up, spooled]


def _exposition(outcomes: dict[str, str], spooled: int | None) -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        workers = CollectorRegistry()
        MultiProcessCollector(workers)  # type: ignore[no-untyped-call]  # unannotated
    else:
        workers = REGISTRY
    at_scrape = CollectorRegistry()
    at_scrape.register(_AtScrape(outcomes, spooled))
    return generate_latest(workers) + generate_latest(at_scrape)


def _spooled() -> int | None:
    """The rows in this machine's spool; None when the spool folder cannot be read
    (said once and counted: the scrape still answers)."""
    try:
        spooled = spool.count()
    except OSError as exc:
        spool.failed("count", exc)
        return None
    spool.worked("count")
    return spooled


@require_GET
async def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics of every worker of this machine (403 unless :func:`allowed`)."""
    if not allowed(request):
        return HttpResponse(
            "Forbidden: see CHATPARITY['METRICS'].\n", status=403, content_type="text/plain"
        )
    # This worker's requests so far; another worker's reach the multiprocess files
    # within FLUSH_SECONDS.
    instruments.flush()
    outcomes = await health.dependencies(counters=True)
    spooled = await sync_to_async(_spooled)()
    body = await sync_to_async(_exposition)(outcomes, spooled)
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
