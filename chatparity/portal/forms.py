"""The portal's forms: a new key, and the month whose usage is shown."""

from __future__ import annotations

import datetime
from typing import Any

from django import forms
from django.utils import timezone

from ..models import ModelAlias, Plan

# The latest expiry a key may be given: later is "never", which is a blank expiry.
LONGEST_LIFE = datetime.timedelta(days=100 * 366)


class UTCDateTimeField(forms.DateTimeField):
    """A time as ``<input type="datetime-local">`` sends it (no zone), read in UTC as the
    label says, whatever the site's ``TIME_ZONE``."""

    def to_python(self, value: Any) -> datetime.datetime | None:
        with timezone.override(datetime.UTC):
            return super().to_python(value)


class AliasesField(forms.ModelMultipleChoiceField):  # type: ignore[type-arg]
    """Aliases by id; an id past what a database integer holds is refused as any id not
    offered (Django's ``pk__in`` look-up of it is an error on SQLite, not no rows)."""

    def clean(self, value: Any) -> Any:
        for pk in value if isinstance(value, list | tuple) else ():
            if _past_any_id(pk):
                raise forms.ValidationError(
                    self.error_messages["invalid_choice"],
                    code="invalid_choice",
                    params={"value": pk},
                )
        return super().clean(value)


def _past_any_id(pk: Any) -> bool:
    try:
        return abs(int(pk)) >= 2**63
    except (TypeError, ValueError):
        return False  # not a number: the field's own message


class NewKeyForm(forms.Form):
    """A key's name, its expiry and its aliases, among those the user's plan allows."""

    name = forms.CharField(max_length=200)
    expires_at = UTCDateTimeField(
        label="Expires at (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Blank: never.",
    )
    aliases = AliasesField(
        queryset=ModelAlias.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every model your plan allows, now and later.",
    )

    def __init__(self, *args: Any, plan: Plan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["aliases"]
        assert isinstance(field, AliasesField)
        field.queryset = plan.usable_aliases().order_by("public_id")

    def clean_expires_at(self) -> datetime.datetime | None:
        expires_at: datetime.datetime | None = self.cleaned_data["expires_at"]
        now = timezone.now()
        if expires_at is not None and not now < expires_at <= now + LONGEST_LIFE:
            raise forms.ValidationError(
                "Give a time in the future, within 100 years, or leave it blank (never)."
            )
        return expires_at


class MonthForm(forms.Form):
    """A calendar month (UTC), as ``<input type="month">`` sends it: ``2025-03``."""

    month = forms.DateField(
        input_formats=["%Y-%m"], widget=forms.DateInput(attrs={"type": "month"}, format="%Y-%m")
    )

    def clean_month(self) -> datetime.date:
        first: datetime.date = self.cleaned_data["month"]
        if first.year >= datetime.MAXYEAR:  # its month's end is past the last date there is
            raise forms.ValidationError(f"Give a month before {datetime.MAXYEAR}.")
        return first

    def span(self) -> tuple[datetime.date, datetime.date]:
        """The month's first day and the next month's."""
        first: datetime.date = self.cleaned_data["month"]
        return first, (first + datetime.timedelta(days=32)).replace(day=1)
