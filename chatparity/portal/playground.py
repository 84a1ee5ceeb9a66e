"""The playground: a signed-in user picks one of their models, types, and watches the
answer stream from ``/v1/chat/completions``, through the same gateway as any client.

The browser calls the API with a key of the user's that the portal makes for it (a POST
under Django's CSRF protection): named "playground", lasting
``CHATPARITY["PORTAL"]["PLAYGROUND_MINUTES"]``, with the plan's limits, needing the
plan, owned (and so logged and budgeted) as the user's. Its plaintext is in the JSON
answer to that POST and then only in the tab's ``sessionStorage``: the server keeps its
hash, as for every key. A user has at most one such key serving: a new one revokes the
one before, and signing out revokes it.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from ..conf import app_settings
from ..models import ApiKey, Plan
from . import usage as own
from .endpoints import api_urls, chat_aliases
from .models import PlaygroundKey
from .views import portal_page, render, user_id

logger = logging.getLogger(__name__)


@require_GET
@portal_page
def page(request: HttpRequest) -> HttpResponse:
    """The playground: the user's chat models, a prompt, the answer as it streams."""
    plan = Plan.objects.for_owner(user_id(request))
    context = {
        "plan": plan,
        "urls": api_urls(request),
        "models": [] if plan is None else chat_aliases(plan.usable_aliases()),
        "minutes": app_settings.PORTAL["PLAYGROUND_MINUTES"],
    }
    return render(request, "playground.html", context)


@require_POST
@portal_page
def new_key(request: HttpRequest) -> JsonResponse:
    """A new playground key for the user (the one before revoked): its plaintext, once."""
    plan = Plan.objects.for_owner(user_id(request))
    if plan is None:
        return JsonResponse(
            {"error": "You have no plan: ask the site's staff for one."}, status=403
        )
    key, plaintext = issue(user_id(request), plan)
    logger.info(
        "chatparity.portal: %s got playground key %s", request.user.get_username(), key.prefix
    )
    expires_at = key.expires_at
    assert expires_at is not None
    return JsonResponse(
        {"key": plaintext, "prefix": key.prefix, "expires_at": expires_at.isoformat()},
        status=201,
    )


def issue(owner_id: int, plan: Plan) -> tuple[ApiKey, str]:
    """A playground key for the user ``owner_id`` under ``plan``, and its plaintext; the
    user's playground keys before it revoked."""
    lifetime = datetime.timedelta(minutes=app_settings.PORTAL["PLAYGROUND_MINUTES"])
    with transaction.atomic():
        # One user's at a time, so that two at once cannot leave two keys serving.
        get_user_model().objects.select_for_update().filter(pk=owner_id).first()
        revoke(owner_id)
        key, plaintext = ApiKey.objects.create_key(
            "playground",
            owner_id=owner_id,
            expires_at=timezone.now() + lifetime,
            needs_plan=True,
            all_aliases=True,  # within the plan's
            **plan.key_limits(),
        )
        PlaygroundKey.objects.create(key=key)
    return key, plaintext


def revoke(owner_id: int) -> None:
    """Revoke the user's playground keys that still serve, each saved (the key cache and
    the audit trail hear of it)."""
    serving = ApiKey.objects.filter(
        owner_id=owner_id, playground__isnull=False, is_active=True, expires_at__gt=timezone.now()
    )
    for key in serving:
        key.is_active = False
        key.save(update_fields=["is_active"])


def revoke_on_sign_out(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    """``user_logged_out``'s receiver: the user's playground key stops with the session."""
    if user is not None:
        revoke(user.pk)


@require_GET
@portal_page
def request_usage(request: HttpRequest) -> JsonResponse:
    """What the playground's request ``?id=<completion id>`` used and cost, read from its
    row in the log (a 404 until the row is written, just after the answer)."""
    row = own.playground_request(user_id(request), request.GET.get("id", ""))
    if row is None:
        return JsonResponse({"error": "Not in the log (yet)."}, status=404)
    return JsonResponse(row)
