import pytest

from tests import services


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", help="Rewrite golden transcripts from the code."
    )


@pytest.fixture(scope="session")
def redis_url():
    """``REDIS_URL`` when set (CI's second pass), else a redis-server of our own."""
    with services.redis() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server: the one in ``DATABASE_URL`` when set, else our own."""
    with services.postgres() as url:
        yield url


@pytest.fixture(autouse=True)
def _forget_lookups():
    """Each test reads keys and aliases afresh, stamps its keys as used, counts its
    requests from zero and knows of no deployment's cooldown: the last test's data was
    rolled back."""
    from django.core.cache import cache

    from chatparity.accounting import inserts, keys, spool
    from chatparity.gateway import routing

    cache.clear()
    keys.forget()
    inserts._stamped.clear()
    routing.forget()
    yield
    keys.forget()
    # Rows a test spooled are not the next test's to write: its database is new.
    folder = spool.open_folder(create=False)
    for name in folder.names() if folder is not None else ():
        if name.startswith(("rows-", "claimed-")):
            folder.unlink(name)
