"""Tests that move the database to an earlier migration and back."""

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import TransactionTestCase


class MigratingTestCase(TransactionTestCase):
    """A test that migrates to given states, the latest again when it ends."""

    def migrate(self, targets):
        """Migrate to ``targets`` ([(app, migration)], or the leaf nodes); the models as
        they were there."""
        executor = MigrationExecutor(connection)
        executor.migrate(targets)
        return executor.loader.project_state(targets).apps

    def latest(self):
        """The latest migrations."""
        return MigrationExecutor(connection).loader.graph.leaf_nodes()

    def tearDown(self):
        self.migrate(self.latest())
