"""The least settings of a site whose users are :class:`~tests.support.member.models.Member`,
on the SQLite file ``MEMBER_DATABASE`` names (a file: the worker's database thread opens
a connection of its own)."""

import os

SECRET_KEY = "tests-member-" + "x" * 40
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "tests.support.member",
    "chatparity",
]
AUTH_USER_MODEL = "member.Member"
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["MEMBER_DATABASE"]}
}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
