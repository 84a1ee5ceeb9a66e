"""``GET /metrics`` answers only the scrapers the settings allow: a bearer token, or an
address in an allowed network; nobody by default."""

import re
import shutil
import tempfile
from pathlib import Path
from unittest import mock

from django.test import AsyncRequestFactory, TestCase, override_settings

from chatparity.accounting import deployments, limits, spool
from chatparity.metrics.views import metrics
from chatparity.models import Backend, Deployment, ModelAlias
from tests.support import spools

TOKEN = "scrape-token-0123456789"


def metrics_settings(**metrics):
    return {"METRICS": metrics}


class ScrapeAuthTests(TestCase):
    async def scrape(self, *, headers=None, address="127.0.0.1"):
        request = AsyncRequestFactory().get("/metrics", headers=headers or {})
        request.META["REMOTE_ADDR"] = address
        return await metrics(request)

    async def test_nobody_may_scrape_by_default(self):
        with override_settings(ROOT_URLCONF="tests.metrics.urls"):
            response = await self.async_client.get("/metrics")
        assert response.status_code == 403
        assert b"chatparity_" not in response.content

    @override_settings(CHATPARITY=metrics_settings(TOKEN=TOKEN))
    async def test_the_token_opens_it_and_nothing_else_does(self):
        assert (await self.scrape(headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200
        assert (await self.scrape(headers={"Authorization": f"Bearer {TOKEN}x"})).status_code == 403
        assert (await self.scrape(headers={"Authorization": f"Basic {TOKEN}"})).status_code == 403
        assert (await self.scrape()).status_code == 403

    @override_settings(CHATPARITY=metrics_settings(ALLOWED_NETWORKS=["10.1.0.0/16", "::1"]))
    async def test_an_allowed_network_opens_it_without_a_token(self):
        assert (await self.scrape(address="10.1.2.3")).status_code == 200
        assert (await self.scrape(address="::1")).status_code == 200
        assert (await self.scrape(address="10.2.0.1")).status_code == 403
        assert (await self.scrape(address="not-an-address")).status_code == 403

    @override_settings(CHATPARITY=metrics_settings(ALLOWED_NETWORKS=["127.0.0.0/8"]))
    async def test_the_exposition_has_the_metrics_and_the_dependencies_health(self):
        response = await self.scrape()
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/plain; version=")
        text = response.content.decode()
        assert "# TYPE chatparity_requests_total counter" in text
        assert "# TYPE chatparity_requests_in_flight gauge" in text
        assert 'chatparity_dependency_up{dependency="database"} 1.0' in text
        assert 'chatparity_dependency_up{dependency="cache"} 1.0' in text
        assert "chatparity_log_rows_spooled 0.0" in text

    @override_settings(
        CHATPARITY={
            **metrics_settings(ALLOWED_NETWORKS=["127.0.0.0/8"]),
            "REDIS_URL": "redis://127.0.0.1:1/0",
        }
    )
    async def test_an_unreachable_redis_reads_as_down(self):
        with mock.patch.object(limits, "_counters", {}):
            text = (await self.scrape()).content.decode()
        assert 'chatparity_dependency_up{dependency="redis"} 0.0' in text


class SpoolTests(TestCase):
    """Reliability (issue 39): a spool folder that cannot be read never fails the scrape."""

    def setUp(self):
        self.enterContext(spools.failures_counted())
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        self.spool = Path(folder) / "spool"

    async def scrape(self):
        request = AsyncRequestFactory().get("/metrics")
        request.META["REMOTE_ADDR"] = "127.0.0.1"
        return await metrics(request)

    async def test_a_spool_folder_that_cannot_be_read_leaves_its_gauge_out_of_a_200(self):
        self.spool.mkdir(mode=0o777)
        self.spool.chmod(0o777)  # refused: others may write to it
        settings = metrics_settings(ALLOWED_NETWORKS=["127.0.0.1"])
        settings["SPOOL_DIR"] = str(self.spool)
        failures = spools.spool_errors("count")
        with override_settings(CHATPARITY=settings), self.assertLogs(spool.logger) as said:
            responses = [await self.scrape(), await self.scrape()]
            self.spool.chmod(0o700)
            mended = await self.scrape()
        assert [response.status_code for response in responses] == [200, 200]
        text = responses[-1].content.decode()
        assert "chatparity_log_rows_spooled" not in text
        assert 'chatparity_spool_errors_total{operation="count"} ' in text
        assert spools.spool_errors("count") - failures == 2
        assert [record.levelname for record in said.records] == ["ERROR", "WARNING"]
        assert "cannot be used to count" in said.records[0].getMessage()
        assert "can be used to count again" in said.records[1].getMessage()
        assert "chatparity_log_rows_spooled 0.0" in mended.content.decode()


@override_settings(CHATPARITY={**metrics_settings(ALLOWED_NETWORKS=["127.0.0.0/8"])})
class DeploymentStateTests(TestCase):
    async def test_each_deployments_state_now_is_in_the_exposition(self):
        own = await Backend.objects.acreate(name="own", kind="local")
        other = await Backend.objects.acreate(name="other", kind="local")
        alias = await ModelAlias.objects.acreate(public_id="pair", backend=own, model="m")
        second = await Deployment.objects.acreate(alias=alias, backend=other, model="n")
        await deployments.told(second, deployments.Outcome(failed=True, retry_after=90))
        request = AsyncRequestFactory().get("/metrics")
        request.META["REMOTE_ADDR"] = "127.0.0.1"
        text = (await metrics(request)).content.decode()
        assert 'chatparity_deployment_up{alias="pair",deployment="own/m"} 1.0' in text
        assert 'chatparity_deployment_up{alias="pair",deployment="other/n"} 0.0' in text
        cooling = re.search(
            r'chatparity_deployment_cooling_seconds\{alias="pair",deployment="other/n"\} (\S+)',
            text,
        )
        assert cooling is not None
        assert 85 < float(cooling.group(1)) <= 90
        assert 'chatparity_deployment_error_share{alias="pair",deployment="other/n"} 1.0' in text
        assert 'chatparity_deployment_in_flight{alias="pair",deployment="own/m"} 0.0' in text
