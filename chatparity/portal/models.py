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
