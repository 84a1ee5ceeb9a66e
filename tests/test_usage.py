"""What one request's log row holds."""

import pytest

from chatparity.models import ApiKey
from chatparity.usage import UsageRecord


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("address", "logged"),
    [("203.0.113.7", "203.0.113.7"), ("::1", "::1"), ("testclient", None), ("", None)],
)
def test_only_ip_addresses_are_logged_as_the_client_ip(address, logged):
    # Servers put other things in REMOTE_ADDR (a Unix socket's path, a test client's
    # name); PostgreSQL refuses them, which would lose the row.
    key, _ = ApiKey.objects.create_key("k")
    row = UsageRecord(request_id="r", api_key=key, client_ip=address).row()
    row.save()
    row.refresh_from_db()
    assert row.client_ip == logged
