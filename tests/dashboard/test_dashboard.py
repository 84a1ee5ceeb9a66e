"""The usage dashboard in the admin, through Django's test client."""

import datetime
import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from pytest_django.asserts import assertContains, assertNotContains

from chatparity.dashboard.admin import utc_today
from chatparity.models import ApiKey, Backend, ModelAlias
from tests.support.logs import logged

URL = "/admin/chatparity_dashboard/usagedashboard/"
EVIL = "<script>alert(1)</script>"

pytestmark = pytest.mark.django_db


def days_ago(days):
    """A UTC day relative to now (not to import time: the suite may cross midnight)."""
    return utc_today() - datetime.timedelta(days=days)


def log(day=None, *, key=None, key_prefix="cp-zzzz", alias="smollm2", **fields):
    """A request logged at noon UTC on ``day`` (today by default)."""
    return logged(
        day or days_ago(0),
        api_key=key,
        key_prefix=key.prefix if key else key_prefix,
        alias=alias,
        **fields,
    )


def totals(response):
    """The headline numbers as the page shows them."""
    content = response.content.decode()
    return {name: value for name, value in re.findall(r'data-total="([\w-]+)">([^<]*)<', content)}


def chart(response, name):
    match = re.search(rf'<svg[^>]*data-chart="{name}".*?</svg>', response.content.decode(), re.S)
    assert match, f"no {name} chart"
    return match.group(0)


def test_default_range_is_the_last_14_utc_days(admin_client):
    today = days_ago(0)
    for day in (today, days_ago(13)):
        log(day)
    log(days_ago(14))
    log(today + datetime.timedelta(days=1))
    response = admin_client.get(URL)
    assert response.status_code == 200
    assert totals(response)["requests"] == "2"
    assertContains(response, f'value="{days_ago(13).isoformat()}"')
    assertContains(response, f'value="{today.isoformat()}"')


def test_page_is_an_admin_page_with_title_and_breadcrumbs(admin_client):
    response = admin_client.get(URL)
    assertContains(response, "<h1>Usage dashboard</h1>", html=True)
    assertContains(response, '<div class="breadcrumbs">')
    assertContains(response, 'href="/admin/chatparity_dashboard/"')
    assertContains(response, "/static/chatparity_dashboard/tail.js")
    assert response.context["site_header"]  # each_context of the admin site


def test_per_key_table_counts_requests_tokens_errors_cache_reads_and_cost(admin_client):
    alpha, _ = ApiKey.objects.create_key("alpha")
    beta, _ = ApiKey.objects.create_key("beta")
    for tokens in (10, 20, 30):
        log(key=alpha, total_tokens=tokens, prompt_tokens=tokens, cached_tokens=tokens // 2,
            cost=Decimal("0.00012345"))  # fmt: skip
    log(key=alpha, status_code=500, error_type="server_error")
    log(days_ago(1), key=beta, total_tokens=7)
    log(key_prefix="cp-gone", total_tokens=1)  # a deleted key keeps its prefix
    response = admin_client.get(URL)
    assertContains(
        response,
        f'<tr class="key-row" data-key-prefix="{alpha.prefix}"><td>alpha</td>'
        f'<td><code>{alpha.prefix}…</code></td><td class="num">4</td><td class="num">60</td>'
        '<td class="num">1</td><td class="num" data-cache-read-share>50.0%</td>'
        '<td class="num" data-cost="0.00037035">0.0004</td></tr>',
        html=True,
    )
    assertContains(
        response,
        f'<tr class="key-row" data-key-prefix="{beta.prefix}"><td>beta</td>'
        f'<td><code>{beta.prefix}…</code></td><td class="num">1</td><td class="num">7</td>'
        '<td class="num">0</td><td class="num" data-cache-read-share>—</td>',
    )
    assertContains(response, 'data-key-prefix="cp-gone"')
    assert totals(response) == {
        "requests": "6", "tokens": "68", "errors": "1", "error-rate": "16.7%",
        "cost": "$0.0004", "cache-read-share": "50.0%",
    }  # fmt: skip
    assertContains(response, 'data-cost="0.00037035" data-total="cost"')


def test_prompt_caching_per_alias_reads_writes_share_and_cost(admin_client):
    log(alias="claude", prompt_tokens=1000, cached_tokens=900, cache_write_5m_tokens=40,
        cache_write_1h_tokens=60, cost=Decimal("0.00123"))  # fmt: skip
    log(alias="claude", prompt_tokens=1000, cache_write_1h_tokens=1000, cost=Decimal("0.006"))
    log(alias="smollm2", prompt_tokens=50)
    response = admin_client.get(URL)
    html = response.content.decode()
    table = re.search(r'<table id="caching-by-alias".*?</table>', html, re.S).group(0)
    rows = [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr class=\"alias-row\".*?</tr>", table)
    ]
    assert rows == [
        ["claude", "2000", "900", "40", "1060", "45.0%", "0.0072"],
        ["smollm2", "50", "0", "0", "0", "0.0%", "0.0000"],
    ]
    assert 'data-cost="0.00723000"' in table


def test_latency_percentiles_and_error_rates_per_alias(admin_client):
    """Percentiles from the rollups' histograms, each within 10% of the true value:
    the p95 of 2 to 40 ms falls on 38 ms, in the bucket (36, 43], and reads 39; the p95
    of 1 and 3 seconds on 3,000 ms, in (2,700, 3,000], and reads 2,850."""
    for ms in range(1, 21):
        log(alias="fast", duration_ms=float(ms), time_to_first_token_ms=2.0 * ms)
    log(alias="slow", duration_ms=1000.0)
    log(alias="slow", duration_ms=3000.0, status_code=200, error_type="server_error")
    response = admin_client.get(URL)
    assertContains(
        response,
        '<tr class="alias-row" data-alias="fast"><td>fast</td><td class="num">20</td>'
        '<td class="num">0.0%</td><td class="num">10</td><td class="num">19</td>'
        '<td class="num">19</td><td class="num">39</td></tr>',
        html=True,
    )
    assertContains(
        response,
        '<tr class="alias-row" data-alias="slow"><td>slow</td><td class="num">2</td>'
        '<td class="num">50.0%</td><td class="num">930</td><td class="num">2850</td>'
        '<td class="num">—</td><td class="num">—</td></tr>',
        html=True,
    )
    assert totals(response)["error-rate"] == "4.5%"  # 1 of 22
    latency = chart(response, "latency-by-alias")
    assert 'data-series="p95 latency" data-category="slow" data-value="2850"' in latency


def test_the_response_cache_s_hit_rate_and_savings_per_alias(admin_client):
    """Hits (semantic ones too) over lookups (misses, partial hits); requests that passed
    it by, or whose alias has none, are not lookups."""
    for cache in ("hit", "semantic", "miss", "partial", "bypass"):
        log(alias="cached", cache=cache, cost_saved="0.25" if cache != "miss" else "0")
    log(alias="uncached")
    response = admin_client.get(URL)
    assertContains(
        response,
        '<tr class="cache-row" data-alias="cached"><td>cached</td><td class="num">2</td>'
        '<td class="num">2</td><td class="num">50.0%</td><td class="num">1.0000</td></tr>',
        html=True,
    )
    assertNotContains(response, '<tr class="cache-row" data-alias="uncached">')


def test_no_response_cache_no_table(admin_client):
    log(alias="uncached")
    assertNotContains(admin_client.get(URL), 'id="cache-by-alias"')


def test_each_aliass_requests_are_split_by_the_deployment_that_served_them(admin_client):
    for ms in (10.0, 20.0, 30.0):
        log(alias="group", deployment="vllm-1/llama", duration_ms=ms, time_to_first_token_ms=ms)
    log(alias="group", deployment="vllm-2/llama", duration_ms=1000.0, status_code=502)
    log(alias="group", deployment="", status_code=429)  # refused before any deployment
    log(alias="other", deployment="")
    response = admin_client.get(URL)
    assertContains(
        response,
        '<tr class="deployment-row" data-alias="group" data-deployment="vllm-1/llama">'
        '<td>group</td><td>vllm-1/llama</td><td class="num">3</td><td class="num">0.0%</td>'
        '<td class="num">19</td><td class="num">29</td><td class="num">19</td>'
        '<td class="num">29</td></tr>',  # 20 and 30 ms, read within their buckets
        html=True,
    )
    assertContains(
        response,
        '<tr class="deployment-row" data-alias="group" data-deployment="vllm-2/llama">'
        '<td>group</td><td>vllm-2/llama</td><td class="num">1</td><td class="num">100.0%</td>'
        '<td class="num">930</td><td class="num">930</td><td class="num">—</td>'
        '<td class="num">—</td></tr>',
        html=True,
    )
    assert response.content.decode().count('class="deployment-row"') == 2
    assertNotContains(admin_client.get(URL, {"alias": "other"}), 'id="latency-by-deployment"')


def test_charts_stack_requests_and_tokens_per_day_by_alias(admin_client):
    log(days_ago(1), alias="a", total_tokens=5)
    log(days_ago(1), alias="a", total_tokens=5)
    log(days_ago(1), alias="b", total_tokens=1)
    today = days_ago(0)
    log(today, alias="b", total_tokens=3)
    response = admin_client.get(URL)
    requests = chart(response, "requests-per-day")
    assert requests.count('<rect class="bar"') == 3
    yesterday = days_ago(1).isoformat()
    assert f'data-series="a" data-category="{yesterday}" data-value="2"' in requests
    assert f'data-series="b" data-category="{today.isoformat()}" data-value="1"' in requests
    assert f'data-category="{days_ago(13).isoformat()}"' not in requests  # no empty bars
    assert f">{days_ago(13).isoformat()}</text>" in requests  # but the day is on the axis
    tokens = chart(response, "tokens-per-day")
    assert f'data-series="a" data-category="{yesterday}" data-value="10"' in tokens
    assert f'data-series="b" data-category="{today.isoformat()}" data-value="3"' in tokens


def test_empty_range_shows_a_message_instead_of_charts(admin_client):
    log(days_ago(30))
    response = admin_client.get(URL)
    assertContains(response, "No requests in this range.")
    assertNotContains(response, "data-chart=")
    assertNotContains(response, 'class="bar"')
    assert totals(response)["requests"] == "0"
    assertContains(response, 'id="live-tail"')  # the tail still runs


def test_date_range_filter(admin_client):
    log(datetime.date(2024, 3, 1))
    log(datetime.date(2024, 3, 2))
    log(datetime.date(2024, 3, 3))
    response = admin_client.get(URL, {"since": "2024-03-02", "until": "2024-03-03"})
    assert totals(response)["requests"] == "2"
    requests = chart(response, "requests-per-day")
    assert ">2024-03-02</text>" in requests
    assert "2024-03-01" not in requests


def test_key_filter_by_prefix(admin_client):
    alpha, _ = ApiKey.objects.create_key("alpha")
    beta, _ = ApiKey.objects.create_key("beta")
    log(key=alpha)
    log(key=beta)
    log(key=beta)
    assertContains(admin_client.get(URL), f'<option value="{alpha.prefix}">alpha ({alpha.prefix}…)')
    response = admin_client.get(URL, {"key": beta.prefix})
    assert totals(response)["requests"] == "2"
    assertContains(response, f'<option value="{beta.prefix}" selected>beta ({beta.prefix}…)')
    assertNotContains(response, f'data-key-prefix="{alpha.prefix}"')


def test_alias_filter_ignores_case_like_the_reports(admin_client):
    ModelAlias.objects.create(public_id="smollm2", backend=Backend.objects.create(name="local"))
    log(alias="smollm2")
    log(alias="SmolLM2")
    log(alias="other")
    response = admin_client.get(URL)
    options = re.findall(r'<option value="([^"]*)"', response.content.decode())
    assert "smollm2" in options
    assert "SmolLM2" not in options  # one entry per name, as the filter ignores case
    response = admin_client.get(URL, {"alias": "smollm2"})
    assert totals(response)["requests"] == "2"
    assertNotContains(response, 'data-alias="other"')


def test_per_endpoint_table_counts_chat_completions_and_responses_apart(admin_client):
    log(endpoint="chat.completions", total_tokens=10)
    log(endpoint="responses", total_tokens=20)
    log(endpoint="responses", total_tokens=5, status_code=400, error_type="invalid_request_error")
    response = admin_client.get(URL)
    assertContains(
        response,
        '<tr class="endpoint-row" data-endpoint="chat.completions">'
        '<td><code>/v1/chat/completions</code></td><td class="num">1</td>'
        '<td class="num">10</td><td class="num">0</td></tr>',
        html=True,
    )
    assertContains(
        response,
        '<tr class="endpoint-row" data-endpoint="responses"><td><code>/v1/responses</code></td>'
        '<td class="num">2</td><td class="num">25</td><td class="num">1</td></tr>',
        html=True,
    )


def test_endpoint_filter_narrows_the_page_and_the_live_tail(admin_client):
    log(endpoint="chat.completions", alias="chat-alias")
    log(endpoint="responses", alias="codex-alias")
    log(endpoint="responses", alias="codex-alias")
    everything = admin_client.get(URL)
    assertContains(everything, '<option value="responses">/v1/responses</option>', html=True)
    assertContains(everything, 'data-endpoint=""')
    response = admin_client.get(URL, {"endpoint": "responses"})
    assert totals(response)["requests"] == "2"
    assertNotContains(response, 'data-alias="chat-alias"')
    assertNotContains(response, 'data-endpoint="chat.completions"')
    assertContains(response, 'data-alias="codex-alias"')
    tail = re.search(r'<table id="live-tail"[^>]*>', response.content.decode()).group(0)
    assert 'data-endpoint="responses"' in tail


@pytest.mark.parametrize("endpoint", ["messages", "embeddings"])
def test_messages_and_embeddings_are_counted_and_filtered_as_their_own_endpoint(
    admin_client, endpoint
):
    log(endpoint="chat.completions", alias="chat-alias")
    log(endpoint=endpoint, alias="other-alias", total_tokens=30)
    response = admin_client.get(URL)
    assertContains(
        response,
        f'<tr class="endpoint-row" data-endpoint="{endpoint}"><td><code>/v1/{endpoint}</code>'
        '</td><td class="num">1</td><td class="num">30</td><td class="num">0</td></tr>',
        html=True,
    )
    assertContains(response, f'<option value="{endpoint}">/v1/{endpoint}</option>', html=True)
    filtered = admin_client.get(URL, {"endpoint": endpoint})
    assert totals(filtered)["requests"] == "1"
    assertNotContains(filtered, 'data-alias="chat-alias"')


def test_an_unknown_endpoint_is_an_error_and_shows_every_endpoint(admin_client):
    log(endpoint="chat.completions")
    log(endpoint="responses")
    response = admin_client.get(URL, {"endpoint": "completions"})
    assert response.context["form"].errors["endpoint"]
    assert totals(response)["requests"] == "2"


def test_user_data_is_escaped_everywhere(admin_client):
    log(alias=EVIL)
    key, _ = ApiKey.objects.create_key(EVIL)
    log(key=key)
    response = admin_client.get(URL)
    assertNotContains(response, "<script>alert(1)")
    assertContains(response, "&lt;script&gt;alert(1)&lt;/script&gt;")
    assert "&lt;script&gt;" in chart(response, "requests-per-day")


@pytest.mark.parametrize(
    "query",
    [
        {"since": "yesterday"},
        {"since": "2025-13-45"},
        {"until": "0001-01-01"},
        {"since": "0001-01-01"},
        {"since": "9999-12-31"},
        {"since": "2024-03-05", "until": "2024-03-01"},
        {"since": "2020-01-01", "until": "2024-01-01"},
        {"key": "no-such-key"},
        {"alias": "no-such-alias"},
        {"since": "2024-03-01\x00"},
    ],
)
def test_bad_filters_show_an_error_and_fall_back_to_defaults(admin_client, query):
    log()
    log(days_ago(3))
    response = admin_client.get(URL, query)
    assert response.status_code == 200
    assert response.context["form"].errors
    assert re.search(r'class="error(note|list)', response.content.decode())  # shown, not just kept
    assert totals(response)["requests"] == "2"


def test_filters_that_are_valid_survive_one_that_is_not(admin_client):
    log(alias="a")
    log(alias="b")
    response = admin_client.get(URL, {"alias": "a", "since": "garbage"})
    assert totals(response)["requests"] == "1"


def test_anonymous_and_non_staff_users_go_to_the_login_page(client, django_user_model):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    client.force_login(django_user_model.objects.create_user("visitor"))
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_permission_are_refused(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("staff", is_staff=True))
    assert client.get(URL).status_code == 403


@pytest.mark.parametrize(
    "permission", ["chatparity.view_requestlog", "chatparity_dashboard.view_usagedashboard"]
)
def test_staff_with_view_permission_see_the_dashboard(client, django_user_model, permission):
    app_label, codename = permission.split(".")
    user = django_user_model.objects.create_user("staff", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label=app_label, codename=codename)
    )
    client.force_login(user)
    log()
    response = client.get(URL)
    assert response.status_code == 200
    assert totals(response)["requests"] == "1"


def test_the_dashboard_is_read_only(admin_client):
    row = log()
    for path in ("add/", f"{row.pk}/change/", f"{row.pk}/delete/", f"{row.pk}/history/"):
        assert admin_client.get(URL + path).status_code == 404, path
    index = admin_client.get("/admin/").content.decode()
    assert f'href="{URL}"' in index
    assert f'href="{URL}add/"' not in index


@pytest.mark.django_db(transaction=True)
def test_staff_allowed_the_dashboard_before_it_was_an_app_of_its_own_still_are(
    django_user_model,
):
    # Until chatparity 0007 the proxy model (and so its permissions) belonged to "chatparity".
    executor = MigrationExecutor(connection)
    executor.migrate([("chatparity_dashboard", None)])
    staff = django_user_model.objects.create_user("staff", is_staff=True)
    staff.user_permissions.add(
        Permission.objects.get(content_type__app_label="chatparity", codename="view_usagedashboard")
    )
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("chatparity_dashboard"))
    ContentType.objects.clear_cache()
    staff = django_user_model.objects.get(pk=staff.pk)
    assert staff.has_perm("chatparity_dashboard.view_usagedashboard")
    assert not ContentType.objects.filter(app_label="chatparity", model="usagedashboard").exists()
