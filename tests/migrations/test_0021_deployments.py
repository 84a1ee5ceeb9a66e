"""Migration 0021: each alias becomes an alias of one deployment, its backend and model."""

from chatparity.models import Deployment
from tests.support.migrating import MigratingTestCase


class MigrationTests(MigratingTestCase):
    """0021 makes each alias an alias of one deployment: its backend and model."""

    BEFORE = [("chatparity", "0020_finer_latency_histograms")]

    def test_each_alias_becomes_an_alias_of_its_own_deployment(self):
        old = self.migrate(self.BEFORE)
        backend = old.get_model("chatparity", "Backend").objects.create(name="b", kind="local")
        aliases = old.get_model("chatparity", "ModelAlias").objects
        aliases.create(public_id="one", backend=backend, model="m1")
        aliases.create(public_id="two", backend=backend, model="")
        self.migrate(self.latest())
        rows = Deployment.objects.order_by("alias__public_id").values_list(
            "alias__public_id", "backend__name", "model", "primary", "weight", "tier", "enabled"
        )
        assert list(rows) == [
            ("one", "b", "m1", True, 1.0, 1, True),
            ("two", "b", "", True, 1.0, 1, True),
        ]
