"""An alias's prices from genai-prices' catalog: found by the backend's base URL or the
model's name, every price the alias has, blanks where the catalog has none, compared
with the alias's own (its blanks at the provider's ratio), and nothing fetched."""

import socket
import sys
from decimal import Decimal

import pytest

from chatparity.accounting import catalog
from chatparity.models import Backend, ModelAlias

ANTHROPIC = "https://api.anthropic.com/v1"
OPENAI = "https://api.openai.com/v1"
STUB = "http://127.0.0.1:9/v1"  # an upstream the catalog knows no provider at


def alias(model, base_url=ANTHROPIC, wire_api="messages", **prices):
    serving = Backend(name="up", kind="openai", base_url=base_url,
                      options={"wire_api": wire_api})  # fmt: skip
    serving.pk = 1
    return ModelAlias(public_id=f"my-{model}", model=model, backend=serving, **prices)


def prices(*values):
    return dict(zip(catalog.PRICE_FIELDS, [None if v is None else Decimal(v) for v in values],
                    strict=True))  # fmt: skip


def test_anthropics_model_at_its_base_url_with_every_cache_price():
    found = catalog.listing(alias("claude-opus-4-1"))
    assert (found.provider, found.model) == ("anthropic", "claude-opus-4-1")
    assert found.prices == prices("15", "75", "1.5", "18.75", "30")
    assert not found.tiered


def test_openais_model_has_no_cache_write_price():
    found = catalog.listing(alias("gpt-4o-mini", OPENAI, "chat"))
    assert found.name == "openai/gpt-4o-mini"
    assert found.prices == prices("0.15", "0.6", "0.075", None, None)


def test_an_upstream_of_no_known_provider_is_found_by_its_models_name():
    assert catalog.listing(alias("claude-opus-4-1", STUB)).name == "anthropic/claude-opus-4-1"


def test_a_model_the_catalog_does_not_know_has_no_listing():
    assert catalog.listing(alias("smollm2-135m", STUB, "chat")) is None
    local = ModelAlias(public_id="smollm2", backend=Backend(pk=2, name="local", kind="local"))
    assert catalog.listing(local) is None


def test_a_long_contexts_dearer_tier_is_flagged_and_the_base_price_kept():
    found = catalog.listing(alias("claude-sonnet-4-5"))
    assert found.tiered
    assert found.prices == prices("3", "15", "0.3", "3.75", "6")


def test_fill_sets_every_price_and_leaves_blank_what_the_catalog_lacks():
    gpt = alias("gpt-4o-mini", OPENAI, "chat", input_price=9, output_price=9,
                cached_input_price=9, cache_write_5m_price=9, cache_write_1h_price=9)  # fmt: skip
    assert gpt.prices.input == 9  # read before: the alias's cached prices are refreshed
    catalog.fill(gpt)
    assert (gpt.input_price, gpt.output_price, gpt.cached_input_price) == (
        Decimal("0.15"), Decimal("0.6"), Decimal("0.075"),
    )  # fmt: skip
    assert (gpt.cache_write_5m_price, gpt.cache_write_1h_price) == (None, None)
    assert gpt.prices.cached_input == Decimal("0.075")
    assert gpt.prices.cache_write_1h == Decimal("0.15")  # OpenAI's: as input
    assert catalog.differences(gpt, catalog.listing(gpt)) == {}
    unknown = alias("smollm2-135m", STUB, "chat", input_price=1, output_price=2)
    assert catalog.fill(unknown) is None
    assert (unknown.input_price, unknown.output_price) == (1, 2)


def test_differences_count_a_blank_at_the_providers_ratio():
    # Anthropic's ratios are claude-opus-4-1's prices: nothing differs.
    opus = alias("claude-opus-4-1", input_price=15, output_price=75)
    assert catalog.differences(opus, catalog.listing(opus)) == {}
    # Behind an OpenAI-compatible API the blank cache prices are OpenAI's ratios.
    routed = alias("claude-opus-4-1", STUB, "chat", input_price=15, output_price=75)
    assert catalog.differences(routed, catalog.listing(routed)) == {
        "cached_input_price": (Decimal("7.5"), Decimal("1.5")),
        "cache_write_5m_price": (Decimal(15), Decimal("18.75")),
        "cache_write_1h_price": (Decimal(15), Decimal(30)),
    }


def test_nothing_is_fetched(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("the catalog went to the network")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    assert catalog.listing(alias("claude-opus-4-1")) is not None


def test_without_the_extra_the_catalog_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "genai_prices", None)  # import fails
    with pytest.raises(catalog.CatalogMissing, match=r"django-chatparity\[prices\]"):
        catalog.listing(alias("claude-opus-4-1"))
