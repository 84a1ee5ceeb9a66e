"""The per-worker cache of keys and aliases."""

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.contrib.auth import get_user_model
from django.db import OperationalError
from django.test import TestCase

from chatparity.accounting import keys
from chatparity.conf import app_settings
from chatparity.models import ApiKey, Backend, ModelAlias, hash_key
from chatparity.protocol.errors import APIError
from tests.support import routed

ROOT = Path(__file__).resolve().parents[2]


class LookupTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        backend = Backend.objects.create(name="local", kind="local")
        ModelAlias.objects.create(public_id="SmolLM2", backend=backend)

    def counting(self, name):
        calls = []
        original = getattr(keys, name)

        def load(*args):
            calls.append(args)
            return original(*args)

        patcher = mock.patch.object(keys, name, load)
        patcher.start()
        self.addCleanup(patcher.stop)
        return calls

    async def test_requests_arriving_together_share_one_load(self):
        grant_loads, alias_loads = self.counting("_load_grant"), self.counting("_load_aliases")
        hashed = hash_key(self.plaintext)
        grants = await asyncio.gather(*(keys.grant(hashed) for _ in range(20)))
        found = await asyncio.gather(*(keys.aliases() for _ in range(20)))
        assert {grant.key.pk for grant in grants} == {self.key.pk}
        assert all(f.find("smollm2", grants[0]) is not None for f in found)
        assert (len(grant_loads), len(alias_loads)) == (1, 1)

    async def test_entries_expire_after_cache_seconds(self):
        loads = self.counting("_load_aliases")
        with mock.patch.object(keys, "clock", return_value=500.0) as clock:
            await keys.aliases()
            clock.return_value += 0.99
            await keys.aliases()
            assert len(loads) == 1
            clock.return_value += 0.02
            await keys.aliases()
            assert len(loads) == 2

    async def test_a_key_revoked_by_another_worker_is_refused_within_cache_seconds(self):
        hashed = hash_key(self.plaintext)
        with mock.patch.object(keys, "clock", return_value=500.0) as clock:
            assert await keys.grant(hashed) is not None
            # update() sends no signal: this worker hears no more than of another's save.
            await ApiKey.objects.filter(pk=self.key.pk).aupdate(is_active=False)
            assert await keys.grant(hashed) is not None
            clock.return_value += app_settings.CACHE_SECONDS + 0.01
            assert await keys.grant(hashed) is None

    async def test_a_key_of_a_deactivated_user_is_refused_within_cache_seconds(self):
        # Security round 3: deactivating a user left their keys working.
        owner = await get_user_model().objects.acreate(username="leaver")
        key, plaintext = await sync_to_async(ApiKey.objects.create_key)("theirs", owner=owner)
        hashed = hash_key(plaintext)
        with mock.patch.object(keys, "clock", return_value=500.0) as clock:
            assert (await keys.grant(hashed)).key.pk == key.pk
            owner.is_active = False
            await owner.asave()  # a user's save empties no cache: CACHE_SECONDS at most
            clock.return_value += app_settings.CACHE_SECONDS + 0.01
            assert await keys.grant(hashed) is None
        assert await keys.grant(hash_key(self.plaintext)) is not None  # a key of no one

    async def test_an_unknown_key_is_none_and_remembered_too(self):
        loads = self.counting("_load_grant")
        assert await keys.grant(hash_key("sk-cp-nobody")) is None
        assert await keys.grant(hash_key("sk-cp-nobody")) is None
        assert len(loads) == 1

    async def test_random_keys_never_grow_the_cache_past_its_bound(self):
        # A bound past the integers Python keeps one object of (256): compared by value.
        with mock.patch.object(keys, "MAX_KEYS", 300):
            for attempt in range(700):
                assert await keys.grant(hash_key(f"sk-cp-random-{attempt}")) is None
                assert len(keys._missing) == min(attempt + 1, 300)  # the oldest forgotten
            assert hash_key("sk-cp-random-399") not in keys._missing
            assert hash_key("sk-cp-random-400") in keys._missing

    async def test_a_flood_of_random_keys_never_pushes_out_the_keys_in_use(self):
        # Security round 4: the cache was emptied whole at its bound, so random keys
        # pushed out valid ones, which a database outage then refused with a 503.
        hashed = hash_key(self.plaintext)
        with (
            mock.patch.object(keys, "MAX_KEYS", 300),
            mock.patch.object(keys, "clock", return_value=500.0),
        ):
            assert await keys.grant(hashed) is not None
            assert await keys.aliases() is not None
            for attempt in range(1000):
                assert await keys.grant(hash_key(f"sk-cp-random-{attempt}")) is None

            def unreachable(*args):
                raise OperationalError("connection refused")

            with (
                mock.patch.object(keys, "_load_grant", unreachable),
                mock.patch.object(keys, "_load_aliases", unreachable),
            ):
                assert (await keys.grant(hashed)).key.pk == self.key.pk
                assert (await keys.aliases()).find("smollm2", None) is not None

    async def test_the_least_recently_used_key_is_forgotten_first(self):
        with mock.patch.object(keys, "MAX_KEYS", 300):
            found = []
            for index in range(301):
                key, plaintext = await sync_to_async(ApiKey.objects.create_key)(f"k{index}")
                found.append(hash_key(plaintext))
                assert (await keys.grant(found[-1])).key.pk == key.pk
                await keys.grant(found[0])  # the first, used again each time
            assert found[0] in keys._entries
            assert found[1] not in keys._entries

    async def test_a_change_saved_while_loading_is_not_hidden_by_the_load(self):
        hashed = hash_key(self.plaintext)
        loading = asyncio.ensure_future(keys.grant(hashed))
        for _ in range(2):  # the request's task, then its load's, take their first step
            await asyncio.sleep(0)
        keys.forget()  # as a save during the load does
        assert (await loading).key.pk == self.key.pk  # the waiting request is served
        assert hashed not in keys._entries  # but the next one reads again

    async def test_while_the_database_is_unreachable_keys_are_served_as_last_read(self):
        hashed = hash_key(self.plaintext)
        tries = []

        def unreachable(*args):
            tries.append(args)
            raise OperationalError("connection refused")

        with mock.patch.object(keys, "clock", return_value=500.0) as clock:
            assert await keys.grant(hashed) is not None
            with mock.patch.object(keys, "_load_grant", unreachable):
                clock.return_value += app_settings.CACHE_SECONDS + 0.01
                assert (await keys.grant(hashed)).key.pk == self.key.pk
                # The database is asked again about once a second, not by each request.
                assert (await keys.grant(hashed)).key.pk == self.key.pk
                assert len(tries) == 1
                clock.return_value += keys.RETRY_SECONDS
                assert (await keys.grant(hashed)).key.pk == self.key.pk
                assert len(tries) == 2
                # Read STALE_SECONDS ago: served still; any longer: no longer trusted.
                clock.return_value = 500.0 + app_settings.STALE_SECONDS
                assert (await keys.grant(hashed)).key.pk == self.key.pk
                assert len(tries) == 3
                clock.return_value += keys.RETRY_SECONDS
                with pytest.raises(APIError) as refused:
                    await keys.grant(hashed)
                assert (refused.value.status, refused.value.code) == (
                    503,
                    "service_unavailable",
                )

    async def test_a_key_never_read_gets_a_503_while_the_database_is_unreachable(self):
        refusal = OperationalError("connection refused")
        with (
            mock.patch.object(keys, "_load_grant", side_effect=refusal),
            pytest.raises(APIError) as refused,
        ):
            await keys.grant(hash_key(self.plaintext))
        assert refused.value.status == 503
        assert refused.value.envelope()["error"]["type"] == "server_error"


def test_a_shared_load_runs_in_the_workers_database_thread():
    # Not in the thread of the request that started it: Django's ASGI handler shuts
    # that thread down when the request ends, while others may still wait for the load.
    threads = []

    def load():
        threads.append(threading.get_ident())
        return keys.Aliases({})

    async def a_request_under_djangos_handler():
        async with ThreadSensitiveContext():
            await keys.aliases()
        return await sync_to_async(threading.get_ident)()

    with mock.patch.object(keys, "_load_aliases", load):
        shared = asyncio.run(a_request_under_djangos_handler())
    assert threads == [shared]


ROUTED = "keys_routed"


@pytest.fixture(scope="module")
def routed_database(postgres_url, django_db_blocker):
    with routed.chatparity_database(postgres_url, ROUTED, django_db_blocker) as url:
        yield url


def test_keys_and_aliases_are_read_on_a_new_connection_once_the_server_dropped_the_last(
    routed_database, django_db_blocker, settings
):
    # A restarted PostgreSQL, or a proxy's idle timeout: the worker's connection is
    # broken, and the next lookup after its cache expired must not be a 503.
    settings.DATABASE_ROUTERS = [routed.ChatparityIn(ROUTED)]
    with django_db_blocker.unblock():
        _, plaintext = ApiKey.objects.create_key("reconnecting")
        backend = Backend.objects.create(name="local-reconnecting", kind="local")
        ModelAlias.objects.create(public_id="reconnecting", backend=backend)
        hashed = hash_key(plaintext)
        assert asyncio.run(keys.grant(hashed)) is not None  # the worker's connection, open
        keys.forget()  # as CACHE_SECONDS later
        assert routed.drop_connections(routed_database) >= 1
        grant = asyncio.run(keys.grant(hashed))
        assert grant is not None
        keys.forget()
        assert routed.drop_connections(routed_database) >= 1
        assert asyncio.run(keys.aliases()).find("reconnecting", grant) is not None


A_SITE_WITH_USERS_OF_ITS_OWN = """
import asyncio, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from chatparity.accounting import keys
from chatparity.models import ApiKey, hash_key
from tests.support.member.models import Member
_, plaintext = ApiKey.objects.create_key("ada", owner=Member.objects.create(email="ada@example"))
print(asyncio.run(keys.grant(hash_key(plaintext))).key.owner.email)
"""


def test_a_key_is_served_on_a_site_whose_user_model_has_no_is_active_field(tmp_path):
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.member.settings",
        "MEMBER_DATABASE": str(tmp_path / "db.sqlite3"),
    }
    served = subprocess.run(
        [sys.executable, "-c", A_SITE_WITH_USERS_OF_ITS_OWN],
        env=environment, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert served.stdout == "ada@example\n", served.stderr[-3000:]
