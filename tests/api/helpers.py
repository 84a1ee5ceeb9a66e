"""Helpers of the management API tests."""

from django.urls import reverse


def url(name, *args):
    return reverse(f"chatparity-api:{name}", args=args)
