"""The example project's own app: every user of the demo may use the portal, under a
starter plan."""

from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.db.models.signals import post_migrate, post_save

PORTAL_GROUP = "Portal users"
STARTER_PLAN = "Starter"
# What the demo's starter plan gives each portal key, and all of a user's keys together.
STARTER = {
    "requests_per_minute": 60,
    "token_budget": 200_000,
    "owner_token_budget": 1_000_000,
}


def portal_group() -> Any:
    """The group holding the portal's permission, with the starter plan, created once."""
    from django.contrib.auth.models import Group, Permission

    from chatparity.models import Plan
    from chatparity.portal.models import PERMISSION

    group, created = Group.objects.get_or_create(name=PORTAL_GROUP)
    if created:
        app_label, codename = PERMISSION.split(".")
        group.permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
        plan, _ = Plan.objects.get_or_create(name=STARTER_PLAN, defaults=STARTER)
        plan.groups.add(group)
    return group


def everyone_in_the_portal_group(**kwargs: Any) -> None:
    """After migrate: the group exists and every user is in it."""
    from django.contrib.auth import get_user_model

    portal_group().user_set.add(*get_user_model().objects.all())


def new_user_in_the_portal_group(instance: Any, created: bool, raw: bool, **kwargs: Any) -> None:
    if created and not raw:
        instance.groups.add(portal_group())


class DemoConfig(AppConfig):
    name = "project"
    verbose_name = "chatparity demo"

    def ready(self) -> None:
        # After the portal's own post_migrate, which creates its permission.
        portal = apps.get_app_config("chatparity_portal")
        post_migrate.connect(everyone_in_the_portal_group, sender=portal)
        post_save.connect(new_user_in_the_portal_group, sender=settings.AUTH_USER_MODEL)
