"""An alias's prices as genai-prices' catalog knows them (the ``[prices]`` extra): what
the admin and the management API fill an alias's prices from, and
``chatparity_check_prices`` compares them with.

The catalog is the snapshot the installed package ships: nothing is fetched (its
``UpdatePrices`` is never started here), so a newer catalog comes with a newer package.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..models import ModelAlias

PRICE_FIELDS = {
    "input_price": "input",
    "output_price": "output",
    "cached_input_price": "cached_input",
    "cache_write_5m_price": "cache_write_5m",
    "cache_write_1h_price": "cache_write_1h",
}
"""Each price of an alias (its field), by its name in :class:`~chatparity.models.Prices`."""

# The catalog's price of each (its price keys, first found), per million tokens: its
# cache write is Anthropic's 5-minute one.
_CATALOG_KEYS = {
    "input_price": ("input_mtok",),
    "output_price": ("output_mtok",),
    "cached_input_price": ("cache_read_mtok",),
    "cache_write_5m_price": ("cache_write_5m_mtok", "cache_write_mtok"),
    "cache_write_1h_price": ("cache_write_1h_mtok",),
}
_PLACES = Decimal("0.000001")  # an alias's prices have six decimal places


class CatalogMissing(RuntimeError):
    """genai-prices is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "The genai-prices catalog is not installed: pip install 'django-chatparity[prices]'."
        )


@dataclass(frozen=True)
class Listing:
    """What the catalog says of an alias's upstream model: its provider and model ids
    there, and a price for each of the alias's fields (None where it has none: the alias
    leaves it blank, to the provider's ratio)."""

    provider: str
    model: str
    prices: dict[str, Decimal | None]
    tiered: bool = False
    """Some price rises past a prompt length (a long context's): the alias keeps the base."""

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}"


def version() -> str:
    """The installed catalog's version."""
    genai_prices = _genai_prices()
    return str(genai_prices.__version__)


def listing(alias: ModelAlias) -> Listing | None:
    """The catalog's entry for ``alias``'s upstream model (its ``model``, else its public
    id), at its backend's provider when the base URL names one the catalog knows, else by
    the model's name alone; None when the catalog does not know it."""
    genai_prices = _genai_prices()
    model = alias.model or alias.public_id
    base_url = alias.backend.base_url if alias.backend_id is not None else ""
    free = genai_prices.Usage(input_tokens=0, output_tokens=0)
    now = datetime.datetime.now(datetime.UTC)
    found: Any = None
    for where in ({"provider_api_url": base_url}, {}) if base_url else ({},):
        try:
            found = genai_prices.calc_price(free, model, genai_request_timestamp=now, **where)
        except LookupError:
            continue
        break
    if found is None:
        return None
    prices: dict[str, Decimal | None] = {}
    tiered = False
    for field, keys in _CATALOG_KEYS.items():
        given = (getattr(found.model_price, key) for key in keys)
        price = next((price for price in given if price is not None), None)
        if isinstance(price, genai_prices.types.TieredPrices):
            price, tiered = price.base, True
        prices[field] = None if price is None else Decimal(price).quantize(_PLACES)
    if prices["input_price"] is None or prices["output_price"] is None:
        return None  # not priced by the token (an image, speech, a search)
    return Listing(found.provider.id, found.model.id, prices, tiered)


def fill(alias: ModelAlias) -> Listing | None:
    """Set ``alias``'s prices to the catalog's (not saved), a price it has none of blank;
    the listing, or None (the alias untouched) when the catalog does not know it."""
    found = listing(alias)
    if found is not None:
        for field, price in found.prices.items():
            setattr(alias, field, price)
        vars(alias).pop("prices", None)  # its cached prices, from the fields as they were
    return found


def differences(alias: ModelAlias, found: Listing) -> dict[str, tuple[Decimal, Decimal]]:
    """The prices where ``alias`` (its blanks at the provider's ratio) and the catalog
    differ, by field: the alias's, then the catalog's."""
    prices = alias.prices
    differ = {}
    for field, listed in found.prices.items():
        own = getattr(prices, PRICE_FIELDS[field]).quantize(_PLACES)
        if listed is not None and own != listed:
            differ[field] = (own, listed)
    return differ


def _genai_prices() -> Any:
    try:
        import genai_prices
    except ImportError:
        raise CatalogMissing() from None
    return genai_prices
