"""What every backend kind checks of its configuration, whoever wrote the row."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from chatparity.backends import get_backend
from chatparity.models import Backend


@pytest.mark.django_db
@pytest.mark.parametrize("base_url", ["https://example.com/v1?", "https://example.com/v1#"])
def test_an_upstream_row_whose_url_would_turn_paths_into_a_query_serves_nothing(base_url):
    # Written past the admin and the API (a queryset update, a fixture): refused when
    # the backend is built, before any request goes to "<base_url>/chat/completions".
    row = Backend.objects.create(name="bare", kind="openai", base_url=base_url)
    with pytest.raises(ImproperlyConfigured, match="give it no query or fragment"):
        get_backend(row)
