"""The audit trail's signal, for a site that forwards entries elsewhere (a SIEM)."""

from django.dispatch import Signal

audit_logged = Signal()
"""Sent with ``entry`` (an :class:`~chatparity.audit.models.AuditEntry`) once the
transaction that wrote it has committed; ``sender`` is ``AuditEntry``."""
