"""Two real uvicorn workers of the example project share prometheus-client's multiprocess
folder: after known traffic spread over both, a scrape of either counts all of it, and
only a scraper with the token gets the metrics."""

import os
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.backends import faulty_upstream
from tests.e2e.load import manage, running_workers

pytestmark = pytest.mark.e2e

TOKEN = "e2e-scrape-token-0123456789"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """The exposition's samples by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(url: str, *, expected: int, timeout: float = 10.0) -> dict[tuple[str, tuple], float]:
    """The samples of ``url``'s metrics once they count ``expected`` requests."""
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        seen = samples(response.text)
        counted = sum(v for (name, _), v in seen.items() if name == "chatparity_requests_total")
        if counted >= expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metrics")
    multiprocess = folder / "prometheus"
    multiprocess.mkdir()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{folder / 'db.sqlite3'}",
        "DEBUG": "0",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "PROMETHEUS_MULTIPROC_DIR": str(multiprocess),
        "CHATPARITY_METRICS_TOKEN": TOKEN,
        "CHATPARITY_METRICS_NETWORKS": "",  # the token only, even from this machine
    }
    env.pop("REDIS_URL", None)
    upstream, stop = faulty_upstream.start("sk-e2e-metrics")
    try:
        manage(env, "migrate", "--verbosity", "0")
        manage(
            env,
            "shell",
            "-c",
            "from chatparity.models import Backend, ModelAlias\n"
            "up = Backend.objects.create(name='loopback', kind='openai',"
            f" base_url='{upstream.base_url}', options={{'retries': 0}})\n"
            "ModelAlias.objects.create(public_id='counted', backend=up, model='canonical')\n",
        )
        key = manage(env, "createapikey", "metrics").strip()
        with running_workers(env, 2, folder / "uvicorn") as running:
            yield [worker.url for worker in running], key
    finally:
        stop()


def test_a_scrape_of_either_worker_counts_the_traffic_of_both(workers):
    urls, key = workers
    headers = {"Authorization": f"Bearer {key}"}
    sent = {"false": 0, "true": 0}
    for number, url in enumerate([*urls, *urls, urls[0]]):  # 3 to one, 2 to the other
        stream = number % 2 == 0
        body = {"model": "counted", "messages": [{"role": "user", "content": "Hi"}]}
        response = httpx.post(
            f"{url}/v1/chat/completions", json={**body, "stream": stream}, headers=headers
        )
        assert response.status_code == 200
        assert float(response.headers["x-chatparity-overhead-ms"]) >= 0
        sent["true" if stream else "false"] += 1
    httpx.post(f"{urls[1]}/v1/chat/completions", json={"model": "made-up"}, headers=headers)

    # A request is counted once its log row is written, just after its reply.
    scraped = [scrape(url, expected=sum(sent.values()) + 1) for url in urls]
    for seen in scraped:
        for stream, count in sent.items():
            labels = {
                "alias": "counted",
                "backend": "loopback",
                "endpoint": "chat.completions",
                "status_class": "2xx",
                "stream": stream,
            }
            assert seen[("chatparity_requests_total", tuple(sorted(labels.items())))] == count
        unknown = {
            "alias": "unknown",
            "backend": "",
            "endpoint": "chat.completions",
            "status_class": "4xx",
            "stream": "false",
        }
        assert seen[("chatparity_requests_total", tuple(sorted(unknown.items())))] == 1
        prompt = (("alias", "counted"), ("kind", "prompt"))
        assert seen[("chatparity_tokens_total", prompt)] == 5 * 5  # the upstream's usage
        assert seen[("chatparity_requests_in_flight", ())] == 0
        assert seen[("chatparity_dependency_up", (("dependency", "database"),))] == 1
    counters = [{key: value for key, value in seen.items() if key[0].endswith("_total")}]
    counters.append({key: value for key, value in scraped[1].items() if key in counters[0]})
    assert counters[0] == counters[1]


def test_the_scrape_needs_the_token(workers):
    urls, key = workers
    assert httpx.get(f"{urls[0]}/metrics").status_code == 403
    wrong = {"Authorization": f"Bearer {key}"}  # an API key is not the scrape token
    assert httpx.get(f"{urls[1]}/metrics", headers=wrong).status_code == 403
