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


@pytest.mark.django_db
def test_nul_characters_a_client_sent_are_replaced_so_postgresql_can_store_the_row(settings):
    settings.CHATPARITY = {"LOG_BODIES": True}
    key, _ = ApiKey.objects.create_key("k")
    record = UsageRecord(request_id="r", api_key=key, user_agent="agent\x00")
    record.alias = "model\x00"
    record.request_body = {"model": "model\x00", "messages": [{"content": "a\x00b"}]}
    row = record.row()
    row.save()
    row.refresh_from_db()
    assert (row.alias, row.user_agent) == ("model\ufffd", "agent\ufffd")
    assert row.request_body == {"model": "model\ufffd", "messages": [{"content": "a\ufffdb"}]}
