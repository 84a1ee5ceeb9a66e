from typing import Any

from django.core.management.base import BaseCommand, CommandError

from chatparity.accounting import catalog
from chatparity.models import ModelAlias


class Command(BaseCommand):
    help = (
        "List the aliases whose prices differ from the genai-prices catalog (the [prices]"
        " extra) for their upstream model: a blank cache price counts at the provider's"
        " ratio to the input price. Fails (exit status 1) when one differs; -v 2 also"
        " lists the aliases the catalog does not know. Nothing is changed: fill an alias's"
        " prices from the catalog in the admin or the management API."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            version = catalog.version()
        except catalog.CatalogMissing as missing:
            raise CommandError(str(missing)) from None
        aliases = list(ModelAlias.objects.select_related("backend").order_by("public_id"))
        differing = unknown = 0
        for alias in aliases:
            found = catalog.listing(alias)
            if found is None:
                unknown += 1
                if options["verbosity"] > 1:
                    self.stdout.write(f"{alias.public_id}: not in the catalog ({alias.model!r}).")
                continue
            differ = catalog.differences(alias, found)
            if differ:
                differing += 1
                self.stdout.write(f"{alias.public_id} ({found.name}): {_described(alias, differ)}.")
        summary = (
            f"{differing} of {len(aliases)} aliases differ from genai-prices {version};"
            f" {unknown} not in it."
        )
        if differing:
            raise CommandError(summary)
        self.stdout.write(summary)


def _described(alias: ModelAlias, differ: dict[str, Any]) -> str:
    """Each price that differs: the alias's (blank: at the provider's ratio), the catalog's."""
    return "; ".join(
        f"{field} {own}{' (blank)' if getattr(alias, field) is None else ''}, the catalog {listed}"
        for field, (own, listed) in differ.items()
    )
