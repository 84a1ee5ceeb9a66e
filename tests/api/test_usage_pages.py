"""usage/ in bounded pages: a grouped answer of any size comes back `limit` groups at a
time, each page read from where the last ended, in memory that does not grow with it."""

import datetime
import gc
import os
import tracemalloc
from urllib.parse import parse_qs, urlparse

import pytest

from chatparity.api.serializers import UsageFilterSerializer
from chatparity.models import DailyKeyUsage

from .helpers import url

pytestmark = pytest.mark.django_db

FIRST_DAY = datetime.date(2025, 1, 1)
MIB = 1024 * 1024


def rollups(days, keys, aliases):
    """One DailyKeyUsage row per day, key and alias: as many groups by all dimensions
    (a grouping by key alone reads another table: group by key and endpoint)."""
    DailyKeyUsage.objects.bulk_create(
        DailyKeyUsage(
            day=FIRST_DAY + datetime.timedelta(days=day),
            key_prefix=f"sk-cp-{key:04d}",
            alias=f"model-{alias}",
            endpoint="chat.completions",
            requests=1 + day,
            prompt_tokens=10,
            total_tokens=10,
        )
        for day in range(days)
        for key in range(keys)
        for alias in range(aliases)
    )


def follow(client, first_url, params):
    """Every page from the first, by its `next` links: their groups and their sizes."""
    groups, sizes = [], []
    response = client.get(first_url, params)
    while True:
        assert response.status_code == 200, response.content
        answer = response.json()
        groups += answer["results"]
        sizes.append(len(answer["results"]))
        if answer["next"] is None:
            return groups, sizes
        response = client.get(answer["next"])


def test_a_large_grouped_answer_comes_in_pages_that_lead_through_every_group_once(admin_client):
    rollups(days=5, keys=20, aliases=5)  # 500 groups
    groups, sizes = follow(
        admin_client, url("usage"), {"group_by": "day,key,alias,endpoint", "limit": 70}
    )
    assert sizes == [70] * 7 + [10]
    seen = [(g["day"], g["key_prefix"], g["alias"], g["endpoint"]) for g in groups]
    assert len(set(seen)) == 500 == len(seen)
    assert seen == sorted(seen)
    assert sum(g["requests"] for g in groups) == sum(1 + day for day in range(5)) * 100


def test_pages_of_fewer_dimensions_sum_across_the_rest(admin_client):
    rollups(days=3, keys=4, aliases=2)
    groups, sizes = follow(admin_client, url("usage"), {"group_by": "key,endpoint", "limit": 3})
    assert sizes == [3, 1]
    assert [(g["key_prefix"], g["requests"]) for g in groups] == [
        (f"sk-cp-{key:04d}", (1 + 2 + 3) * 2) for key in range(4)
    ]
    assert {g["key_name"] for g in groups} == {g["key_prefix"] for g in groups}  # deleted keys


def test_the_default_page_and_the_cap(admin_client):
    rollups(days=1, keys=UsageFilterSerializer.DEFAULT_LIMIT + 1, aliases=1)
    first = admin_client.get(url("usage"), {"group_by": "key,endpoint"}).json()
    assert len(first["results"]) == UsageFilterSerializer.DEFAULT_LIMIT
    assert first["next"] is not None
    last = admin_client.get(first["next"]).json()
    assert (len(last["results"]), last["next"]) == (1, None)


def test_a_limit_above_the_cap_is_the_cap(monkeypatch, admin_client):
    monkeypatch.setattr(UsageFilterSerializer, "MAX_LIMIT", 4)
    rollups(days=1, keys=6, aliases=1)
    capped = admin_client.get(url("usage"), {"group_by": "key,endpoint", "limit": 1000}).json()
    assert len(capped["results"]) == 4
    assert capped["next"] is not None


@pytest.mark.parametrize("limit", ["0", "-1", "x"])
def test_a_limit_below_one_is_a_400(admin_client, limit):
    response = admin_client.get(url("usage"), {"limit": limit})
    assert response.status_code == 400
    assert "limit" in response.json()


def test_a_cursor_of_another_group_by_or_garbage_is_a_400(admin_client):
    rollups(days=2, keys=2, aliases=1)
    by_key = admin_client.get(url("usage"), {"group_by": "key,endpoint", "limit": 1}).json()
    cursor = parse_qs(urlparse(by_key["next"]).query)["cursor"][0]
    for group_by, bad in (
        ("day", cursor),
        ("key,endpoint", "not-a-cursor"),
        ("key,endpoint", "e30="),
    ):
        response = admin_client.get(url("usage"), {"group_by": group_by, "cursor": bad})
        assert response.status_code == 400, bad
        assert "cursor" in response.json()


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_three_large_calls_leave_the_worker_no_bigger_and_never_hold_the_whole_answer(
    admin_client,
):
    """20,000 groups (some 8 MiB of JSON whole): each call holds one page of them, and
    what it took is returned: three calls in a row leave the resident size where one
    left it."""
    rollups(days=20, keys=200, aliases=5)
    params = {"group_by": "day,key,alias,endpoint", "limit": 500}
    admin_client.get(url("usage"), params)  # warm: imports, caches, the first arena
    gc.collect()
    before = resident_bytes()
    tracemalloc.start()
    try:
        for _ in range(3):
            assert len(admin_client.get(url("usage"), params).json()["results"]) == 500
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    gc.collect()
    assert peak < 8 * MIB  # the whole answer takes some 100 MiB in Python objects
    assert resident_bytes() - before < 16 * MIB
