"""Audit entries written by the model signals of keys, aliases (and their deployments),
backends and plans, and of what gives the site's users access or takes it away.

A save is compared with the row as the database held it just before (read in
``pre_save``), so an entry lists only the fields that really changed; a
many-to-many change lists the related objects before and after. An entry is
written in the change's own transaction (a change rolled back leaves none) and
announced by :data:`~chatparity.audit.signals.audit_logged` once it commits.

Keys, aliases, backends and plans are recorded whole: created, changed (by
``save()``, or in bulk by a queryset's ``update()`` or ``bulk_update()``, which
:data:`chatparity.signals.rows_updated` announces) and deleted (one by one or by a
queryset's ``delete()``). Of a user, only what changes their access: ``is_active``
and their groups (plans and the portal's permission come with them), from either
side (``user.groups``, ``group.user_set``). The deletion of a user, a group or an
alias, which empties a key's owner, a plan's members or aliases, or a user's groups
with no signal of theirs, is recorded on each of them as well.

Not recorded: ``bulk_create()``, raw SQL, a user changed by a queryset's
``update()`` (the user model is the site's), rows of a many-to-many table written
through its own model.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from .. import actors
from ..encryption import EncryptedTextField
from ..models import STAMPS, ApiKey, Backend, Deployment, ModelAlias, Plan
from ..signals import rows_updated
from .models import Action, AuditEntry
from .signals import audit_logged

AUDITED: tuple[type[models.Model], ...] = (ApiKey, ModelAlias, Backend, Plan, Deployment)
# Of the site's user model, what an entry follows: whether they may sign in, and their
# groups. Their creation and deletion are the site's own.
USER_FIELDS = ("is_active",)
USER_RELATIONS = ("groups",)
SECRET = "(secret)"
"""Shown in place of a secret's value: that it changed is all an entry says."""
# Never shown as they are: a key's hash (what the key is checked against) and any
# encrypted field.
SECRET_FIELDS = {"hashed_key"}
# JSON fields whose member maps names to values that may be credentials: a backend's
# extra request headers (an Azure "api-key", a gateway's token). Names are shown.
SECRET_MEMBERS: dict[tuple[type[models.Model], str], str] = {(Backend, "options"): "headers"}

_BEFORE = "_chatparity_audit_before"


@dataclass(frozen=True)
class Followed:
    """What the entries of one model show: ``fields``, ``relations`` (many-to-many),
    and whether its creation and deletion are recorded too (``whole``)."""

    fields: tuple[models.Field[Any, Any], ...]
    relations: tuple[models.ManyToManyField[Any, Any], ...]
    whole: bool


@functools.cache
def followed() -> dict[type[models.Model], Followed]:
    """Each model whose changes are recorded, and what of it."""
    found = {
        model: Followed(
            tuple(recorded_fields(model)), tuple(model._meta.local_many_to_many), whole=True
        )
        for model in AUDITED
    }
    user: Any = get_user_model()
    fields = tuple(f for f in user._meta.concrete_fields if f.name in USER_FIELDS)
    relations = tuple(f for f in user._meta.many_to_many if f.name in USER_RELATIONS)
    if fields or relations:
        found[user] = Followed(fields, relations, whole=False)
    return found


def connect() -> None:
    """Connect the receivers for every followed model and its many-to-many fields."""
    for model, follows in followed().items():
        uid = f"chatparity.audit.{model._meta.label}"
        if follows.fields:
            pre_save.connect(_read_before, sender=model, dispatch_uid=uid)
            post_save.connect(_saved, sender=model, dispatch_uid=uid)
        if follows.whole:
            post_delete.connect(_deleted, sender=model, dispatch_uid=uid)
            rows_updated.connect(_updated, sender=model, dispatch_uid=uid)
        for field in follows.relations:
            m2m_changed.connect(
                _related_changed,
                sender=field.remote_field.through,
                dispatch_uid=f"{uid}.{field.name}",
            )
    for target in {field.related_model for _, field in _dependents()}:
        pre_delete.connect(
            _dependent_changed, sender=target, dispatch_uid=f"chatparity.audit.of.{target}"
        )


def _dependents() -> list[tuple[type[models.Model], models.Field[Any, Any]]]:
    """The fields of followed models that the deletion of another object changes with
    no signal of their own: many-to-many fields (their rows go with it) and foreign
    keys set to null (a user deleted leaves their keys to no one)."""
    return [
        (model, field)
        for model, follows in followed().items()
        for field in [*follows.fields, *follows.relations]
        if field.many_to_many
        or (field.many_to_one and getattr(field.remote_field, "on_delete", None) is models.SET_NULL)
    ]


def _dependent_changed(
    sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any
) -> None:
    """``instance`` is about to be deleted: an entry for each followed object that loses
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
    """The fields an entry of a key, alias, backend or plan shows: every column but the
    id and the timestamps."""
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


def _changes(
    fields: tuple[models.Field[Any, Any], ...],
    before: dict[str, Any] | None,
    after: dict[str, Any],
    using: str,
) -> dict[str, Any]:
    """Each of ``fields`` whose value (by attribute name) differs between ``before``
    (None: the object is new) and ``after``, as an entry shows it."""
    changes = {}
    for field in fields:
        if field.attname not in after:
            continue
        new = after[field.attname]
        if before is None:
            changes[field.name] = {"before": None, "after": _shown(field, new, using)}
        elif before[field.attname] != new:
            changes[field.name] = {
                "before": _shown(field, before[field.attname], using),
                "after": _shown(field, new, using),
            }
    return changes


def _read_before(
    sender: type[models.Model],
    instance: models.Model,
    raw: bool,
    using: str,
    update_fields: frozenset[str] | None,
    **kwargs: Any,
) -> None:
    fields = followed()[sender].fields
    if instance.pk is None:
        return
    if update_fields is not None and not {field.name for field in fields} & update_fields:
        return  # a user's last login stamped, say: no query
    names = [field.attname for field in fields]
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
    follows = followed()[sender]
    before = instance.__dict__.pop(_BEFORE, None)
    if before is None and not follows.whole:
        return  # a user created (or a save that changed none of the fields followed)
    fields = follows.fields
    if update_fields is not None:
        fields = tuple(field for field in fields if field.name in update_fields)
    after = {field.attname: field.value_from_object(instance) for field in fields}
    changes = _changes(fields, before, after, using)
    if changes:
        action = Action.CREATE if before is None else Action.UPDATE
        _record(sender, instance, action, changes, using)


def _updated(
    sender: type[models.Model],
    before: dict[Any, dict[str, Any]],
    after: dict[Any, dict[str, Any]],
    using: str,
    **kwargs: Any,
) -> None:
    """A queryset's ``update()``: an entry for each row it changed."""
    fields = followed()[sender].fields
    objects = sender._base_manager.using(using).in_bulk(list(after))
    for pk, values in after.items():
        changes = _changes(fields, before[pk], values, using)
        if changes and pk in objects:
            _record(sender, objects[pk], Action.UPDATE, changes, using)


def _deleted(sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any) -> None:
    changes = {
        field.name: {
            "before": _shown(field, field.value_from_object(instance), using),
            "after": None,
        }
        for field in followed()[sender].fields
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
    """A many-to-many change, made from either side: an entry for each followed object
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
    for model, follows in followed().items():
        for field in follows.relations:
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
