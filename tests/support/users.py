"""A site's own users for the portal and audit tests: members of a group holding the
portal's permission, with a plan."""

from django.contrib.auth.models import Group, Permission, User

from chatparity.models import Plan

PASSWORD = "a-password-for-tests"


def portal_group() -> Group:
    """The group whose members may use the portal, as a site sets one up."""
    group, _ = Group.objects.get_or_create(name="portal users")
    permission = Permission.objects.get(
        content_type__app_label="chatparity_portal", codename="use_portal"
    )
    group.permissions.add(permission)
    return group


def portal_user(username: str, plan: Plan | None = None, *, permitted: bool = True) -> User:
    """A user in the portal group (unless not ``permitted``), given ``plan`` directly."""
    user = User.objects.create_user(username, password=PASSWORD)
    if permitted:
        user.groups.add(portal_group())
    if plan is not None:
        plan.users.add(user)
    return user
