"""The self-service portal: a site's signed-in users issue and revoke their own API keys
under the plan staff gave them, and read their own usage and requests.

Opt-in, with no dependency beyond Django: add ``"chatparity.portal"`` to
``INSTALLED_APPS``, mount ``include("chatparity.portal.urls")`` (e.g. at ``portal/``),
and give the permission ``chatparity_portal.use_portal`` to the groups whose users may
use it. Pages extend ``CHATPARITY["PORTAL"]["BASE_TEMPLATE"]`` (blocks ``title`` and
``content``); each can be overridden under ``templates/chatparity/portal/``.
"""
