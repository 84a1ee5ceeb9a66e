"""The portal's usage and requests pages: a user's own requests, tokens and cost for a
month, by day and by alias, what is left of each budget, and their latest requests
without bodies; never another user's."""

import datetime
import re
from decimal import Decimal

from django.db import connection
from django.test import TestCase, override_settings
from django.test.utils import CaptureQueriesContext

from chatparity.models import ApiKey, Backend, ModelAlias, Plan
from tests.support.logs import logged
from tests.support.users import portal_user

UTC = datetime.UTC


def used(key, when, alias="smollm2", prompt=10, completion=5, cost="0.001", **fields):
    """A request of ``key`` logged at ``when``."""
    return logged(
        at=when, api_key=key, key_prefix=key.prefix, alias=alias, prompt_tokens=prompt,
        completion_tokens=completion, total_tokens=prompt + completion, cost=Decimal(cost),
        duration_ms=120.0, **fields,
    )  # fmt: skip


def table(page, table_id):
    """The rows of the table ``table_id`` on ``page``, as lists of cell texts."""
    html = page.content.decode()
    body = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', html, re.S)[1]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]
    return [[re.sub(r"<[^>]+>", "", cell).strip() for cell in row] for row in cells]


class UsageTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        backend = Backend.objects.create(name="local", kind="local")
        ModelAlias.objects.create(public_id="smollm2", backend=backend)
        cls.plan = Plan.objects.create(name="starter", owner_token_budget=1000)
        cls.alice = portal_user("alice", cls.plan)
        cls.bob = portal_user("bob", cls.plan)
        cls.laptop, _ = ApiKey.objects.create_key("laptop", owner=cls.alice, token_budget=500)
        cls.server, _ = ApiKey.objects.create_key("server", owner=cls.alice)
        cls.bobs, _ = ApiKey.objects.create_key("bobs", owner=cls.bob)
        march = datetime.datetime(2025, 3, 1, tzinfo=UTC)
        used(cls.laptop, march + datetime.timedelta(hours=1))
        used(cls.laptop, march + datetime.timedelta(days=1, hours=2), alias="gpt")
        used(cls.server, march + datetime.timedelta(days=1, hours=3), prompt=100, cost="0.01")
        used(cls.laptop, datetime.datetime(2025, 4, 1, tzinfo=UTC))  # the next month
        used(cls.bobs, march + datetime.timedelta(hours=5), prompt=9999)

    def setUp(self):
        self.client.force_login(self.alice)

    def test_a_months_usage_by_day_by_alias_and_in_total(self):
        page = self.client.get("/portal/usage/", {"month": "2025-03"})
        assert page.status_code == 200
        assert table(page, "by-day") == [
            ["2025-03-01", "1", "10", "0", "0", "5", "15", "0.0%", "0.0010", "—", "0.0000"],
            ["2025-03-02", "2", "110", "0", "0", "10", "120", "0.0%", "0.0110", "—", "0.0000"],
        ]
        assert table(page, "by-alias") == [
            ["gpt", "1", "10", "0", "0", "5", "15", "0.0%", "0.0010", "—", "0.0000"],
            ["smollm2", "2", "110", "0", "0", "10", "120", "0.0%", "0.0110", "—", "0.0000"],
        ]
        assert table(page, "total") == [
            ["3", "120", "0", "0", "15", "135", "0.0%", "0.0120", "—", "0.0000"]
        ]

    def test_another_month_holds_only_its_rows(self):
        page = self.client.get("/portal/usage/", {"month": "2025-04"})
        assert table(page, "total") == [
            ["1", "10", "0", "0", "5", "15", "0.0%", "0.0010", "—", "0.0000"]
        ]
        assert table(page, "by-day") == [
            ["2025-04-01", "1", "10", "0", "0", "5", "15", "0.0%", "0.0010", "—", "0.0000"]
        ]

    def test_another_users_rows_never_count(self):
        self.client.force_login(self.bob)
        page = self.client.get("/portal/usage/", {"month": "2025-03"})
        assert table(page, "total") == [
            ["1", "9,999", "0", "0", "5", "10,004", "0.0%", "0.0010", "—", "0.0000"]
        ]

    def test_the_response_cache_s_hit_rate_and_what_it_saved(self):
        may = datetime.datetime(2025, 5, 1, tzinfo=UTC)
        used(self.laptop, may, cache="miss")
        for key in (self.laptop, self.server):
            used(key, may, prompt=0, completion=0, cost="0", cache="hit", cost_saved="0.001")
        page = self.client.get("/portal/usage/", {"month": "2025-05"})
        assert table(page, "total") == [
            ["3", "10", "0", "0", "5", "15", "0.0%", "0.0010", "67%", "0.0020"]
        ]

    def test_a_month_that_is_not_one_is_a_400(self):
        # 9999-12 is a month, whose end no date can hold: a 400 too, not a 500.
        for month in ("2025-13", "March", "2025-03-01'", "9999-12", "9999-01"):
            page = self.client.get("/portal/usage/", {"month": month})
            assert page.status_code == 400
            assert "errorlist" in page.content.decode()

    def test_what_is_left_of_the_owner_budget_and_each_keys_budget(self):
        this_month = datetime.datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0)
        used(self.laptop, this_month, prompt=100, completion=20)
        used(self.server, this_month, prompt=200, completion=30)
        page = self.client.get("/portal/usage/")
        assert table(page, "owner-budget") == [
            ["tokens this month (all your keys)", "350", "1,000"]
        ]
        html = page.content.decode()
        laptop = re.search(r"laptop <code>.*?<tbody>(.*?)</tbody>", html, re.S)[1]
        assert re.findall(r"<td[^>]*>(.*?)</td>", laptop) == ["tokens this month", "120", "500"]

    def test_showing_what_is_left_again_sums_no_rows(self):
        # The counters, once seeded, say what is left: a user reloading the page must not
        # make the database sum a month of their keys' rows each time.
        this_month = datetime.datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0)
        used(self.laptop, this_month, prompt=100, completion=20)
        self.client.get("/portal/usage/")
        with CaptureQueriesContext(connection) as queries:
            page = self.client.get("/portal/usage/")
        assert table(page, "owner-budget") == [
            ["tokens this month (all your keys)", "120", "1,000"]
        ]
        sums = [query["sql"] for query in queries if "SUM(" in query["sql"].upper()]
        assert not [sql for sql in sums if "chatparity_requestlog" in sql], sums
        assert len(sums) == 1, sums  # the month's table, from the rollups


class RecentRequestsTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.alice = portal_user("alice")
        cls.bob = portal_user("bob")
        cls.key, _ = ApiKey.objects.create_key("laptop", owner=cls.alice)
        bobs, _ = ApiKey.objects.create_key("bobs", owner=cls.bob)
        start = datetime.datetime(2025, 3, 1, tzinfo=UTC)
        for minute in range(5):
            used(
                cls.key,
                start + datetime.timedelta(minutes=minute),
                alias=f"model-{minute}",
                request_body={"messages": [{"role": "user", "content": "my secret prompt"}]},
                response_body="the model's private answer",
            )
        used(bobs, start, alias="bobs-model")

    def setUp(self):
        self.client.force_login(self.alice)

    def test_the_latest_requests_newest_first_with_their_facts(self):
        rows = table(self.client.get("/portal/requests/"), "requests")
        assert [row[2] for row in rows] == [f"model-{m}" for m in (4, 3, 2, 1, 0)]
        assert rows[0] == [
            "2025-03-01 00:04:00", f"laptop {self.key.prefix}…", "model-4", "chat.completions",
            "200", "15", "0", "0", "0.001000", "120",
        ]  # fmt: skip

    def test_never_a_body_nor_another_users_request(self):
        html = self.client.get("/portal/requests/").content.decode()
        assert "secret prompt" not in html
        assert "private answer" not in html
        assert "bobs-model" not in html

    @override_settings(CHATPARITY={"PORTAL": {"RECENT_REQUESTS": 2}})
    def test_as_many_as_the_setting_says(self):
        rows = table(self.client.get("/portal/requests/"), "requests")
        assert [row[2] for row in rows] == ["model-4", "model-3"]
