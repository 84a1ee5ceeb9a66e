"""The audit trail's one model."""

from __future__ import annotations

from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from ..actors import Source


class Action(models.TextChoices):
    CREATE = "create", "created"
    UPDATE = "update", "changed"
    DELETE = "delete", "deleted"


class AuditEntry(models.Model):
    """One change to one object: who made it (a user, or a command's name), when, from
    where, and each changed field's value before and after (a secret's never)."""

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    source = models.CharField(max_length=16, choices=Source.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The user who made the change, if it was made by a signed-in user.",
    )
    actor_name = models.CharField(
        max_length=150,
        blank=True,
        help_text="The user's name, or the command's: kept when the user is deleted.",
    )
    ip = models.GenericIPAddressField("IP address", null=True, blank=True)
    content_type = models.ForeignKey(ContentType, on_delete=models.PROTECT)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField("object", max_length=200)
    action = models.CharField(max_length=8, choices=Action.choices)
    changes = models.JSONField(
        default=dict,
        encoder=DjangoJSONEncoder,
        help_text='{field: {"before": value, "after": value}}; a secret shows as "(secret)".',
    )

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        ordering = ["-created_at", "-pk"]
        # Read, never written by hand: no add, change or delete permission exists.
        default_permissions = ("view",)
        indexes = [models.Index(fields=["content_type", "object_id"])]

    def __str__(self) -> str:
        who = self.actor_name or self.get_source_display()
        return f"{who} {self.get_action_display()} {self.object_repr}"
