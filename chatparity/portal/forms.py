"""The portal's forms: a new key, and the month whose usage is shown."""

from __future__ import annotations

import datetime
from typing import Any

from django import forms
from django.utils import timezone

from ..models import ModelAlias, Plan


class NewKeyForm(forms.Form):
    """A key's name, its expiry and its aliases, among those the user's plan allows."""

    name = forms.CharField(max_length=200)
    expires_at = forms.DateTimeField(
        label="Expires at (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Blank: never.",
    )
    aliases = forms.ModelMultipleChoiceField(
        queryset=ModelAlias.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every model your plan allows, now and later.",
    )

    def __init__(self, *args: Any, plan: Plan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["aliases"]
        assert isinstance(field, forms.ModelMultipleChoiceField)
        field.queryset = plan.usable_aliases().order_by("public_id")

    def clean_expires_at(self) -> datetime.datetime | None:
        expires_at: datetime.datetime | None = self.cleaned_data["expires_at"]
        if expires_at is not None and expires_at <= timezone.now():
            raise forms.ValidationError("Give a time in the future, or leave it blank.")
        return expires_at


class MonthForm(forms.Form):
    """A calendar month (UTC), as ``<input type="month">`` sends it: ``2025-03``."""

    month = forms.DateField(
        input_formats=["%Y-%m"], widget=forms.DateInput(attrs={"type": "month"}, format="%Y-%m")
    )

    def span(self) -> tuple[datetime.date, datetime.date]:
        """The month's first day and the next month's."""
        first: datetime.date = self.cleaned_data["month"]
        return first, (first + datetime.timedelta(days=32)).replace(day=1)
