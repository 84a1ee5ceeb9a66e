import logging

from django.apps import AppConfig
from django.contrib.auth import get_user_model
from django.core.signals import setting_changed
from django.db.models.signals import m2m_changed, post_delete, post_save


class ChatparityConfig(AppConfig):
    name = "chatparity"
    verbose_name = "chatparity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .accounting.keys import forget
        from .models import ApiKey, Backend, Deployment, ModelAlias, Plan, check_aliases_added

        # A change saved in this process applies to the very next request.
        for model in (ApiKey, ModelAlias, Backend, Plan, Deployment):
            uid = f"chatparity.forget.{model.__name__}"
            post_save.connect(forget, sender=model, dispatch_uid=uid)
            post_delete.connect(forget, sender=model, dispatch_uid=uid)
        # And which aliases a key may use, which plan its owner has: the plan's users and
        # groups, and the groups' members.
        related = [ApiKey.allowed_aliases, Plan.allowed_aliases, Plan.users, Plan.groups]
        if hasattr(get_user_model(), "groups"):
            related.append(get_user_model().groups)
        for relation in related:
            m2m_changed.connect(forget, sender=relation.through)
        # A user or group deleted leaves plans and keys without them, with no m2m signal.
        for owner in (get_user_model(), "auth.Group"):
            post_delete.connect(forget, sender=owner, dispatch_uid=f"chatparity.forget.{owner}")
        setting_changed.connect(forget)
        # A key for every alias names none, whichever side adds one.
        m2m_changed.connect(
            check_aliases_added,
            sender=ApiKey.allowed_aliases.through,
            dispatch_uid="chatparity.check_aliases_added",
        )
        self._recover_journals()

    def _recover_journals(self) -> None:
        """Spool, as interrupted, the requests that workers killed on this machine left
        in flight (written to the log by the first batch this process writes)."""
        from .accounting.journal import recover

        try:
            recover()
        except OSError:
            logging.getLogger(__name__).exception("chatparity: journals not recovered")
