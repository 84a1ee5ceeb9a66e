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

from ..accounting import deployments, keys, spool
from ..accounting.limits import Unavailable
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


DeploymentState = tuple[str, str, deployments.Health, float]
"""An alias's public id, a deployment's label, its state, the store's time then."""


async def deployment_states() -> list[DeploymentState]:
    """Each deployment of the aliases of several deployments, with its state now, as
    every worker routes by it; none while the counters cannot be read."""
    states = []
    for alias in (await keys.aliases()).by_id.values():
        group = deployments.serving(alias)
        if len(group) < 2:
            continue
        try:
            snapshot = await deployments.snapshot(group, alias.pk, samples="stream")
        except Unavailable:
            return []
        for deployment in group:
            health = snapshot.health.get(deployments.scope(deployment), deployments.HEALTHY)
            states.append((alias.public_id, deployment.label, health, snapshot.now))
    return states


def _deployment_metrics(states: list[DeploymentState]) -> list[Metric]:
    labels = ["alias", "deployment"]
    families = {
        "up": GaugeMetricFamily(
            "chatparity_deployment_up",
            "1 if the deployment may serve now, 0 while it cools down (or waits for the one"
            " request that tries it again).",
            labels=labels,
        ),
        "cooling": GaugeMetricFamily(
            "chatparity_deployment_cooling_seconds",
            "Seconds until the deployment's cooldown ends (0: not cooling).",
            labels=labels,
        ),
        "in_flight": GaugeMetricFamily(
            "chatparity_deployment_in_flight",
            "Requests the deployment serves now, counted by every worker.",
            labels=labels,
        ),
        "failures": GaugeMetricFamily(
            "chatparity_deployment_failures_in_a_row",
            "The deployment's failures since its last success.",
            labels=labels,
        ),
        "error_share": GaugeMetricFamily(
            "chatparity_deployment_error_share",
            "Of the deployment's requests over ROUTING's failure window, the share that failed.",
            labels=labels,
        ),
        "first_token": GaugeMetricFamily(
            "chatparity_deployment_first_token_p50_seconds",
            "The median of the deployment's recent times to first token (streams).",
            labels=labels,
        ),
    }
    for alias, deployment, state, now in states:
        named = [alias, deployment]
        cooling = max(0.0, state.cooling_until - now)
        families["up"].add_metric(named, 0.0 if cooling or state.half_open else 1.0)
        families["cooling"].add_metric(named, cooling)
        families["in_flight"].add_metric(named, state.in_flight)
        families["failures"].add_metric(named, state.failures)
        if state.error_share is not None:
            families["error_share"].add_metric(named, state.error_share)
        first_token = deployments.percentile(state.samples, 50)
        if first_token is not None:
            families["first_token"].add_metric(named, first_token / 1000)
    return list(families.values())


class _AtScrape(Collector):
    """What is read when scraped, once for the machine: the dependencies' health, the
    log rows waiting in the spool (left out when the spool cannot be read), and the
    state of the deployments (shared by every machine)."""

    def __init__(
        self,
        outcomes: dict[str, str],
        spooled: int | None,
        states: list[DeploymentState] | None = None,
    ) -> None:
        self.outcomes, self.spooled, self.states = outcomes, spooled, states or []

    def collect(self) -> list[Metric]:
        return [*self._machine(), *_deployment_metrics(self.states)]

    def _machine(self) -> list[Metric]:
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


def _exposition(
    outcomes: dict[str, str], spooled: int | None, states: list[DeploymentState] | None = None
) -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        workers = CollectorRegistry()
        MultiProcessCollector(workers)  # type: ignore[no-untyped-call]  # unannotated
    else:
        workers = REGISTRY
    at_scrape = CollectorRegistry()
    at_scrape.register(_AtScrape(outcomes, spooled, states))
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
    states = await deployment_states()
    body = await sync_to_async(_exposition)(outcomes, spooled, states)
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
