"""The audit trail: an entry for every change to API keys, model aliases, backends and
plans, from the admin, the management API, the portal and management commands: who,
when, from where, and each field's value before and after (secrets never shown).

Opt-in, with no dependency beyond Django: add ``"chatparity.audit"`` to
``INSTALLED_APPS`` and ``"chatparity.audit.middleware.AuditMiddleware"`` to
``MIDDLEWARE``. Entries are read-only in the admin (view permission); a site forwards
them elsewhere (a SIEM) from :data:`chatparity.audit.signals.audit_logged`.
"""
