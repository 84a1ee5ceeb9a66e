"""Audit entries written by the model signals of keys, aliases (and their deployments),
backends and plans.

A save is compared with the row as the database held it just before (read in
``pre_save``), so an entry lists only the fields that really changed; a
many-to-many change lists the related objects before and after. An entry is
written in the change's own transaction (a change rolled back leaves none) and
announced by :data:`~chatparity.audit.signals.audit_logged` once it commits.

The deletion of a user, a group or an alias, which empties a key's owner or a plan's
members or aliases with no signal of theirs, is recorded on each of them as well.
Changes made with a queryset's ``update()`` send no signal and leave no entry.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from .. import actors
from ..encryption import EncryptedTextField
from ..models import ApiKey, Backend, Deployment, ModelAlias, Plan
from .models import Action, AuditEntry
from .signals import audit_logged

AUDITED: tuple[type[models.Model], ...] = (ApiKey, ModelAlias, Backend, Plan, Deployment)
SECRET = "(secret)"
"""Shown in place of a secret's value: that it changed is all an entry says."""
# Never shown as they are: a key's hash (what the key is checked against) and any
# encrypted field.
SECRET_FIELDS = {"hashed_key"}
# JSON fields whose member maps names to values that may be credentials: a backend's
# extra request headers (an Azure "api-key", a gateway's token). Names are shown.
SECRET_MEMBERS: dict[tuple[type[models.Model], str], str] = {(Backend, "options"): "headers"}
# Stamped by chatparity itself, not changed by anyone.
STAMPS = {"last_used_at"}

_BEFORE = "_chatparity_audit_before"


def connect() -> None:
    """Connect the receivers for every audited model and its many-to-many fields."""
    for model in AUDITED:
        uid = f"chatparity.audit.{model.__name__}"
        pre_save.connect(_read_before, sender=model, dispatch_uid=uid)
        post_save.connect(_saved, sender=model, dispatch_uid=uid)
        post_delete.connect(_deleted, sender=model, dispatch_uid=uid)
        for field in model._meta.local_many_to_many:
            through = field.remote_field.through
            m2m_changed.connect(
                _related_changed, sender=through, dispatch_uid=f"{uid}.{field.name}"
            )
    for target in {field.related_model for _, field in _dependents()}:
        pre_delete.connect(
            _dependent_changed, sender=target, dispatch_uid=f"chatparity.audit.of.{target}"
        )


def _dependents() -> list[tuple[type[models.Model], models.Field[Any, Any]]]:
    """The fields of audited models that the deletion of another object changes with no
    signal of their own: many-to-many fields (their rows go with it) and foreign keys
    set to null (a user deleted leaves their keys to no one)."""
    return [
        (model, field)
        for model in AUDITED
        for field in [*model._meta.concrete_fields, *model._meta.local_many_to_many]
        if field.many_to_many
        or (field.many_to_one and getattr(field.remote_field, "on_delete", None) is models.SET_NULL)
    ]


def _dependent_changed(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    """``instance`` is about to be deleted: an entry for each audited object that loses
    it, from a foreign key or a many-to-many field."""
    gone = str(instance)
    for model, field in _dependents():
        if field.related_model is not sender:
            continue
        for obj in model._base_manager.using(using).filter(**{field.name: instance}):
            change: dict[str, Any] = {"before": gone, "after": None}
            if isinstance(field, models.ManyToManyField):
                before = _related(obj, field, using)
                change = {"before": before, "after": [name for name in before if name != gone]}
            _record(model, obj, Action.UPDATE, {field.name: change}, using)


def recorded_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    """The fields an entry shows: every column but the id and the timestamps."""
    return [
        field
        for field in model._meta.concrete_fields
        if not field.primary_key
        and field.name not in STAMPS
        and not getattr(field, "auto_now", False)
        and not getattr(field, "auto_now_add", False)
    ]


def is_secret(field: models.Field[Any, Any]) -> bool:
    return isinstance(field, EncryptedTextField) or field.name in SECRET_FIELDS


def _shown(field: models.Field[Any, Any], value: Any, using: str) -> Any:
    """``value`` of ``field`` as an entry shows it: a secret hidden, a related
    object by its name, anything else as JSON writes it."""
    if is_secret(field) and value:
        return SECRET
    if field.is_relation and value is not None:
        related = field.related_model._base_manager.using(using).filter(pk=value).first()  # type: ignore[union-attr]
        return str(related) if related is not None else f"#{value}"
    member = SECRET_MEMBERS.get((field.model, field.name))
    if member is not None and isinstance(value, dict) and isinstance(value.get(member), dict):
        value = {**value, member: dict.fromkeys(value[member], SECRET)}
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def _read_before(
    sender: type[models.Model], instance: models.Model, raw: bool, using: str, **kwargs: Any
) -> None:
    if instance.pk is None:
        return
    names = [field.attname for field in recorded_fields(sender)]
    before = sender._base_manager.using(using).filter(pk=instance.pk).values(*names).first()
    instance.__dict__[_BEFORE] = before


def _saved(
    sender: type[models.Model],
    instance: models.Model,
    created: bool,
    using: str,
    update_fields: frozenset[str] | None,
    **kwargs: Any,
) -> None:
    before = instance.__dict__.pop(_BEFORE, None)
    fields = recorded_fields(sender)
    if update_fields is not None:
        fields = [field for field in fields if field.name in update_fields]
    changes = {}
    for field in fields:
        after = field.value_from_object(instance)
        if before is None:
            changes[field.name] = {"before": None, "after": _shown(field, after, using)}
        elif before[field.attname] != after:
            old = before[field.attname]
            changes[field.name] = {
                "before": _shown(field, old, using),
                "after": _shown(field, after, using),
            }
    if changes:
        action = Action.CREATE if before is None else Action.UPDATE
        _record(sender, instance, action, changes, using)


def _deleted(sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any) -> None:
    changes = {
        field.name: {
            "before": _shown(field, field.value_from_object(instance), using),
            "after": None,
        }
        for field in recorded_fields(sender)
    }
    _record(sender, instance, Action.DELETE, changes, using)


def _related_changed(
    sender: type[models.Model],
    instance: models.Model,
    action: str,
    reverse: bool,
    pk_set: set[Any] | None,
    using: str,
    **kwargs: Any,
) -> None:
    """A many-to-many change, made from either side: an entry for each audited object
    whose related set changed, with the set before and after."""
    model, field = _m2m_field(sender)
    noted = f"{_BEFORE}_{field.name}"
    if action.startswith("pre_"):
        if not reverse:
            objects = [instance]
        elif pk_set is not None:
            objects = list(model._base_manager.using(using).filter(pk__in=pk_set))
        else:  # cleared from the other side: what was related to it
            objects = list(model._base_manager.using(using).filter(**{field.name: instance}))
        instance.__dict__[noted] = {obj.pk: _related(obj, field, using) for obj in objects}
        return
    befores = instance.__dict__.pop(noted, {})
    if reverse:
        objects = list(model._base_manager.using(using).filter(pk__in=list(befores)))
    else:
        objects = [instance]
    for obj in objects:
        before, after = befores.get(obj.pk, []), _related(obj, field, using)
        if before != after:
            _record(
                model, obj, Action.UPDATE, {field.name: {"before": before, "after": after}}, using
            )


def _m2m_field(
    through: type[models.Model],
) -> tuple[type[models.Model], models.ManyToManyField[Any, Any]]:
    for model in AUDITED:
        for field in model._meta.local_many_to_many:
            if field.remote_field.through is through:
                return model, field
    raise LookupError(through)


def _related(obj: models.Model, field: models.ManyToManyField[Any, Any], using: str) -> list[str]:
    return sorted(str(related) for related in getattr(obj, field.name).using(using).all())


def _record(
    model: type[models.Model],
    instance: models.Model,
    action: Action,
    changes: dict[str, Any],
    using: str,
) -> None:
    actor = actors.current()
    entry = AuditEntry.objects.using(using).create(
        source=actor.source,
        actor=actor.user,
        actor_name=actor.name[:150],
        ip=actor.ip,
        content_type=ContentType.objects.db_manager(using).get_for_model(model),
        object_id=str(instance.pk),
        object_repr=str(instance)[:200],
        action=action,
        changes=changes,
    )
    transaction.on_commit(partial(audit_logged.send, sender=AuditEntry, entry=entry), using=using)
