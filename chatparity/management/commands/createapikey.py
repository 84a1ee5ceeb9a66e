from typing import Any

from django.core.management.base import CommandParser

from chatparity.management.base import ChangingCommand
from chatparity.models import ApiKey


class Command(ChangingCommand):
    help = "Create an API key and print its plaintext, the only time it is shown."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        _, plaintext = ApiKey.objects.create_key(options["name"])
        self.stdout.write(plaintext)
