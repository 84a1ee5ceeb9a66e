"""The base of chatparity's commands that change keys, aliases, backends or plans."""

from typing import Any

from django.core.management.base import BaseCommand

from ..actors import acting_as_command


class ChangingCommand(BaseCommand):
    """A command whose changes the audit trail records as its own, by its name."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        with acting_as_command(self.__module__.rsplit(".", 1)[-1]):
            return super().execute(*args, **options)
