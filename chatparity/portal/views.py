"""The portal's pages: a user's own keys, usage and requests, and nobody else's; and
its sign-in and sign-out pages, for a site without its own.

Every key is looked up with its owner, so another user's key is a 404 whatever id is
asked for; changes are POSTs under Django's CSRF protection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any, cast

from asgiref.sync import async_to_sync
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required, permission_required
from django.contrib.auth.views import LoginView, LogoutView
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from ..accounting import limits
from ..conf import app_settings
from ..models import ApiKey, ModelAlias, Plan
from . import usage as own
from .endpoints import api_urls, chat_aliases
from .forms import MonthForm, NewKeyForm
from .models import PERMISSION
from .snippets import snippets

logger = logging.getLogger(__name__)

View = Callable[..., HttpResponse]


def portal_page(view: View) -> View:
    """A page for signed-in users holding the portal's permission (others: a 403), never
    cached: it shows one user's own data."""

    @wraps(view)
    @never_cache
    @login_required
    @permission_required(PERMISSION, raise_exception=True)
    def page(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return view(request, *args, **kwargs)

    return page


def render(
    request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
) -> TemplateResponse:
    context = {"portal_base_template": app_settings.PORTAL["BASE_TEMPLATE"], **context}
    return TemplateResponse(request, f"chatparity/portal/{template}", context, status=status)


def user_id(request: HttpRequest) -> int:
    """The signed-in user's id (every portal page has one)."""
    return cast(int, request.user.pk)


def own_keys(request: HttpRequest) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(owner_id=user_id(request))


def live_keys(keys: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
    """The keys that still serve: active and not expired."""
    return keys.filter(is_active=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )


def made_keys(request: HttpRequest) -> QuerySet[ApiKey]:
    """The user's keys but those the playground made, which ``MAX_KEYS`` does not count."""
    return own_keys(request).filter(playground__isnull=True)


def listed_keys(request: HttpRequest) -> QuerySet[ApiKey]:
    """The keys the user sees: those they made, and the playground's while it serves."""
    playground = live_keys(own_keys(request)).filter(playground__isnull=False)
    return made_keys(request) | playground


def usable_aliases(key: ApiKey, plan: Plan) -> QuerySet[ModelAlias]:
    """The aliases ``key`` may use under ``plan``."""
    aliases = plan.usable_aliases()
    return aliases if key.all_aliases else aliases.filter(api_keys=key)


def _keys_page(
    request: HttpRequest, plan: Plan | None, form: NewKeyForm | None, status: int = 200
) -> TemplateResponse:
    """The user's keys, each with what it used of each limit if it still serves (its
    owner budgets too: every key is read with the plan, as the gateway reads it)."""
    keys = listed_keys(request).prefetch_related("allowed_aliases")
    live = set(live_keys(own_keys(request)).values_list("pk", flat=True))
    rows = []
    for key in keys.order_by("-created_at", "-pk"):
        key.owner_plan = plan
        rows.append((key, async_to_sync(limits.standing)(key) if key.pk in live else None))
    context = {
        "rows": rows,
        "plan": plan,
        "form": form,
        "live": live_keys(made_keys(request)).count(),
        "max_keys": app_settings.PORTAL["MAX_KEYS"],
    }
    return render(request, "keys.html", context, status)


@require_GET
@portal_page
def keys(request: HttpRequest) -> HttpResponse:
    """The user's keys, and a form for a new one under their plan."""
    plan = Plan.objects.for_owner(user_id(request))
    return _keys_page(request, plan, NewKeyForm(plan=plan) if plan is not None else None)


@require_POST
@portal_page
def create_key(request: HttpRequest) -> HttpResponse:
    """A new key with the plan's limits and budgets; its plaintext shown on this response only."""
    plan = Plan.objects.for_owner(user_id(request))
    if plan is None:
        return HttpResponseForbidden("You have no plan: ask the site's staff for one.")
    form = NewKeyForm(request.POST, plan=plan)
    if not form.is_valid():
        return _keys_page(request, plan, form, status=400)
    most = app_settings.PORTAL["MAX_KEYS"]
    with transaction.atomic():
        # One user's creations one at a time, so that two at once cannot pass the cap.
        get_user_model().objects.select_for_update().filter(pk=user_id(request)).first()
        if live_keys(made_keys(request)).count() >= most:
            form.add_error(
                None, f"You hold {most} active keys, the most allowed: revoke one first."
            )
            return _keys_page(request, plan, form, status=400)
        aliases = form.cleaned_data["aliases"]
        key, plaintext = ApiKey.objects.create_key(
            form.cleaned_data["name"],
            owner_id=user_id(request),
            expires_at=form.cleaned_data["expires_at"],
            needs_plan=True,  # bounded by the plan while the user has it, refused after
            all_aliases=not aliases,
            **plan.key_limits(),
        )
        key.allowed_aliases.set(aliases)
    logger.info("chatparity.portal: %s created key %s", request.user.get_username(), key.prefix)
    urls = api_urls(request)
    models = chat_aliases(usable_aliases(key, plan))
    per_model = {model: snippets(urls, plaintext, model) for model in models} if urls else {}
    context = {
        "key": key,
        "plaintext": plaintext,
        "urls": urls,
        "models": models,
        "snippets": per_model[models[0]] if per_model else [],
        # Each model's snippets, which the page's model chooser puts in place.
        "snippets_by_model": {
            model: {snippet.slug: snippet.text for snippet in written}
            for model, written in per_model.items()
        }
        if len(per_model) > 1
        else {},
    }
    return render(request, "key_created.html", context, status=201)


@require_POST
@portal_page
def revoke_key(request: HttpRequest, pk: int) -> HttpResponse:
    """Revoke one of the user's keys, at once on this worker (the key cache hears of the
    save), within ``CACHE_SECONDS`` on the others."""
    key = get_object_or_404(own_keys(request), pk=pk)
    if key.is_active:
        key.is_active = False
        key.save(update_fields=["is_active"])
        logger.info("chatparity.portal: %s revoked key %s", request.user.get_username(), key.prefix)
    messages.success(request, f"Revoked {key}.")
    return redirect("chatparity-portal:keys")


@require_GET
@portal_page
def usage(request: HttpRequest) -> HttpResponse:
    """Requests, tokens and cost by day and by alias for a month (``?month=2025-03``,
    else this one), and what is left of each limit and budget."""
    this_month = timezone.now().date().replace(day=1)
    form = MonthForm(
        request.GET if "month" in request.GET else {"month": this_month.strftime("%Y-%m")}
    )
    context: dict[str, Any] = {"form": form}
    if not form.is_valid():
        return render(request, "usage.html", context, status=400)
    first, end = form.span()
    plan = Plan.objects.for_owner(user_id(request))
    context.update(
        own.usage(user_id(request), first, end),
        month=first,
        plan=plan,
        owner_standing=_owner_standing(request, plan),
        key_standing=[
            (key, async_to_sync(limits.standing)(key))
            for key in live_keys(own_keys(request)).order_by("-created_at", "-pk")
        ],
    )
    return render(request, "usage.html", context)


def _owner_standing(request: HttpRequest, plan: Plan | None) -> list[limits.Standing]:
    if plan is None or not (plan.has_owner_budget or plan.has_key_budget):
        return []
    return async_to_sync(limits.owner_standing)(user_id(request), plan)


@require_GET
@portal_page
def recent_requests(request: HttpRequest) -> HttpResponse:
    """The user's latest requests: time, key, alias, endpoint, status, tokens, cost,
    latency (never a body)."""
    count = app_settings.PORTAL["RECENT_REQUESTS"]
    rows = own.recent_requests(user_id(request), count)
    return render(request, "requests.html", {"rows": rows, "count": count})


class SignIn(LoginView):
    """The portal's own sign-in page, for a site without one (``LOGIN_URL =
    "chatparity-portal:login"``): back to the page asked for, else to the user's keys."""

    template_name = "chatparity/portal/login.html"
    next_page = "chatparity-portal:keys"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["portal_base_template"] = app_settings.PORTAL["BASE_TEMPLATE"]
        return context


class SignOut(LogoutView):
    """Sign out (a POST), then the sign-in page."""

    next_page = "chatparity-portal:login"
