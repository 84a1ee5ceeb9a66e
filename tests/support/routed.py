"""chatparity's tables in a PostgreSQL database of their own, as a site that routes them
there has them; and the server's side of the connections to it ended, as a restarted
server or a proxy's idle timeout ends them."""

from collections.abc import Iterator
from contextlib import contextmanager

import dj_database_url
import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from tests import services


class ChatparityIn:
    """A site's router: chatparity's models in the database ``alias``, the rest in
    ``default``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model, **hints):
        return self.alias if model._meta.app_label == "chatparity" else None

    db_for_write = db_for_read


@contextmanager
def chatparity_database(server_url: str, alias: str, django_db_blocker) -> Iterator[str]:
    """A new database on the PostgreSQL at ``server_url``, migrated, in the settings as
    ``alias``; its URL."""
    url = services.create_database(server_url, f"chatparity_{alias}")
    settings.DATABASES[alias] = dj_database_url.parse(url)
    connections.configure_settings(settings.DATABASES)
    with django_db_blocker.unblock():
        call_command("migrate", database=alias, verbosity=0)
    try:
        yield url
    finally:
        connections[alias].close()
        del settings.DATABASES[alias]


def drop_connections(url: str) -> int:
    """End every other session on the database at ``url`` (``pg_terminate_backend``):
    each of this process's connections to it is broken, and finds out on its next
    query. How many were ended."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        ).fetchone()
    assert ended is not None
    return ended[0]
