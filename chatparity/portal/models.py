from django.db import models

from ..models import ApiKey

PERMISSION = "chatparity_portal.use_portal"


class OwnKey(ApiKey):
    """An API key as its owner sees it in the portal: the holder of the portal's
    permission, which sites grant through groups. Keys are saved as :class:`ApiKey`."""

    class Meta:
        proxy = True
        verbose_name = "own API key"
        default_permissions = ()
        permissions = [("use_portal", "Can issue and revoke own API keys and see own usage")]


class PlaygroundKey(models.Model):
    """A key the portal made for its owner's playground: short-lived, at most one active
    per user (a new one revokes the one before), its plaintext only ever in the browser
    tab that asked for it."""

    key = models.OneToOneField(
        ApiKey, primary_key=True, on_delete=models.CASCADE, related_name="playground"
    )

    class Meta:
        default_permissions = ()

    def __str__(self) -> str:
        return str(self.key)
