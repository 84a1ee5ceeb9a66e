"""Log rows kept on local disk while the database cannot take them, written when it can.

Each process appends the rows it could not write to a file of its own in the spool
folder (``CHATPARITY["SPOOL_DIR"]``), one JSON line per row, fsynced before the
request's write returns. Any process of the machine drains every file: it claims
the file by renaming it, writes the rows the database does not hold yet (known by
their ``request_id``, so a drain cut short between its commit and the file's removal
writes nothing twice), then deletes the file.

Other users of the machine are not trusted: a process opens the folder once, checks
the folder it opened (never through a symlink, this user's alone), and makes, opens,
renames and deletes its files relative to it (:class:`Folder`), so a name swapped
afterwards reaches nothing else. A folder reached through symlinks is resolved once
(:func:`resolve`), when no other user can change where they lead; else refused.

A folder refused stops the server at start (``FastPath`` calls :func:`open_for_serving`;
the system check ``chatparity.E071`` says so before). One that fails later, while it
serves, is said once and counted (:func:`failed`), never raised to a request or a
scrape.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hmac
import logging
import os
import stat
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.db.models import Field
from django.utils import timezone

from .. import signals
from ..conf import app_settings
from ..models import RequestLog
from . import inserts

logger = logging.getLogger(__name__)

_ROWS = "rows-"
_CLAIMED = "claimed-"
_SUFFIX = ".jsonl"
# request_ids asked of the database at once (SQLite takes 999 parameters at most).
_LOOKUP_CHUNK = 500


class Folder:
    """The spool folder, open: its files are made, opened, renamed and deleted relative
    to it, never through a symlink (``O_NOFOLLOW``). A new file is made with ``O_EXCL``
    once whatever had its name is gone, and a file opened to append to is this user's
    alone, else refused (:class:`PermissionError`)."""

    def __init__(self, path: Path, descriptor: int) -> None:
        self.path = path
        self.descriptor = descriptor

    def names(self) -> list[str]:
        """The names of its regular files (not of a symlink, whatever it points at)."""
        return [
            entry.name
            for entry in os.scandir(self.descriptor)
            if entry.is_file(follow_symlinks=False)
        ]

    def open(self, name: str, flags: int) -> int:
        """``name``, opened with ``flags``: only this user's own file (:class:`OSError`
        when it is a symlink, :class:`PermissionError` when another user may use it)."""
        descriptor = os.open(name, flags | _NO_LINK, 0o600, dir_fd=self.descriptor)
        status = os.fstat(descriptor)
        if status.st_uid != os.getuid() or status.st_mode & 0o022:
            os.close(descriptor)
            raise PermissionError(f"{self.path / name} is not this user's alone")
        return descriptor

    def create(self, name: str) -> int:
        """A new, empty file ``name``, open to read and write: what had that name (a
        file, a symlink) is unlinked first, never written to."""
        self.unlink(name)
        return self.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)

    def rename(self, old: str, new: str) -> None:
        os.rename(old, new, src_dir_fd=self.descriptor, dst_dir_fd=self.descriptor)

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.descriptor)

    def names_file(self, name: str, descriptor: int) -> bool:
        """Whether ``name`` is the file open as ``descriptor`` (not one renamed since)."""
        try:
            found = os.stat(name, dir_fd=self.descriptor, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return found.st_ino == os.fstat(descriptor).st_ino

    def sync(self) -> None:
        """Make its entries (a file just made, or renamed) durable."""
        os.fsync(self.descriptor)


_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC
# Folders this process opened, by their real path: each is opened and checked once.
_opened: dict[str, Folder] = {}
# The folders this process was configured with, to their real paths: resolved once.
_resolved: dict[Path, Path] = {}
# The symlinks a path may go through, at most (as the kernel's MAXSYMLINKS).
_MAX_LINKS = 40

FIX = (
    "Point CHATPARITY['SPOOL_DIR'] at a folder of the server's user that no other user may"
    " write to, reached through folders and symlinks that are the server user's or root's"
    " and that no other user may write to (a sticky folder such as /tmp excepted); or leave"
    " SPOOL_DIR unset (a folder named by a keyed hash in the temporary directory)."
)


class Refused(PermissionError):
    """The spool folder, refused: what is wrong with it."""


def open_folder(*, create: bool = True) -> Folder | None:
    """The spool folder (:func:`real_path`), made when ``create`` (else None when there
    is none), opened once and checked on what was opened: a symlink, or a folder
    another user owns or may write to, is refused (:class:`Refused`), since rows put
    there would be written to the log as they are, and the journals read back."""
    path = real_path()
    opened = _opened.get(str(path))
    if opened is not None and os.fstat(opened.descriptor).st_nlink:  # not removed since
        return opened
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NO_LINK)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:  # ELOOP: a symlink (put there since it was resolved); ENOTDIR
        raise Refused(f"{path} is not a folder: chatparity will not spool there") from exc
    problem = folder_problem(os.fstat(descriptor))
    if problem:
        os.close(descriptor)
        raise Refused(f"{path} {problem}: chatparity will not spool there")
    opened = _opened[str(path)] = Folder(path, descriptor)
    return opened


def open_for_serving() -> Folder:
    """The spool folder, made and opened as a worker starts to serve; else
    :class:`ImproperlyConfigured` naming ``SPOOL_DIR``, what is wrong and the fix: a
    server that can neither spool the rows the database cannot take nor journal its
    requests in flight must not serve (it would lose rows without a word)."""
    try:
        folder = open_folder()
    except OSError as exc:
        configured = app_settings.SPOOL_DIR
        named = (
            f"CHATPARITY['SPOOL_DIR'] ({configured})"
            if configured
            else "The spool folder (CHATPARITY['SPOOL_DIR'] unset)"
        )
        raise ImproperlyConfigured(
            f"{named} cannot be used, so chatparity will not serve: {exc}. {FIX}"
        ) from exc
    assert folder is not None  # made
    return folder


def folder_problem(status: os.stat_result) -> str:
    """What makes the folder of ``status`` one chatparity will not spool in; "" if
    nothing."""
    if not stat.S_ISDIR(status.st_mode):
        return "is not a folder"
    if status.st_uid != os.getuid():
        return f"is not this user's alone: it belongs to another user (uid {status.st_uid})"
    if status.st_mode & 0o022:
        mode = stat.S_IMODE(status.st_mode)
        return f"is not this user's alone: other users may write to it (mode {mode:o})"
    return ""


def real_path() -> Path:
    """:func:`spool_path` with its symlinks resolved (:func:`resolve`) the first time it
    is asked for, as the server starts: the same folder after, wherever the links
    come to point."""
    path = spool_path()
    real = _resolved.get(path)
    if real is None:
        real = _resolved[path] = resolve(path)
    return real


def resolve(path: Path) -> Path:
    """``path`` with the symlinks on its way resolved, if no user but this one or root
    can change where they lead: each symlink is theirs, and so is every folder on the
    way (the links' and the real folder's, up to ``/``), which no other user may write
    to (a sticky one, as /tmp, excepted: there others cannot rename or remove what is
    not theirs, though they may make what is not there yet). Else :class:`Refused`.

    A path with no symlink on its way is ``path`` itself (the system check
    ``chatparity.W070`` warns about folders above it that others may write to); the
    part of the path not made yet is kept as it is."""
    absolute = path.absolute()
    here = Path(absolute.anchor)
    ahead = list(reversed(absolute.parts[1:]))
    links: list[Path] = []
    problems: list[str] = []
    while ahead:
        name = ahead.pop()
        if name == "..":
            here = here.parent
            continue
        entry = here / name
        try:
            status: os.stat_result | None = os.lstat(entry)
        except FileNotFoundError:
            status = None
        problems.append(_changeable(here, entry, status))
        if status is None:
            here = entry.joinpath(*reversed(ahead))
            break
        if not stat.S_ISLNK(status.st_mode):
            here = entry
            continue
        links.append(entry)
        if len(links) > _MAX_LINKS:
            raise Refused(f"{path} goes through more than {_MAX_LINKS} symlinks")
        target = Path(os.readlink(entry))
        if target.is_absolute():
            here = Path(target.anchor)
        ahead.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
    if not links:
        return path
    problem = next((problem for problem in problems if problem), "")
    if problem:
        raise Refused(
            f"{path} goes through the symlink {links[0]}, and {problem}: another user"
            " could change where it leads"
        )
    return here


def _changeable(folder: Path, entry: Path, status: os.stat_result | None) -> str:
    """Why a user other than this one or root could change what ``entry`` (of
    ``status``; None: not made yet) is in ``folder``; "" if none could."""
    trusted = (os.getuid(), 0)
    holder = os.stat(folder)
    if holder.st_uid not in trusted:
        return f"{folder} belongs to another user (uid {holder.st_uid})"
    if status is not None and status.st_uid not in trusted:
        return f"{entry} belongs to another user (uid {status.st_uid})"
    if not holder.st_mode & 0o022:
        return ""
    if not holder.st_mode & stat.S_ISVTX:
        return f"other users may write to {folder}"
    if status is None:
        return f"{entry} is not made yet, in {folder}, where other users may make it first"
    return ""


# The operations the spool folder failed, logged and not done well since (failed()).
_said: set[str] = set()


def failed(operation: str, error: BaseException) -> None:
    """The spool folder could not be used to ``operation`` (``drain``, ``count``,
    ``keep``): counted each time (the observers'
    :meth:`~chatparity.signals.Observer.spool_failed`), logged the first time, and again
    only once it has :func:`worked` since."""
    for observer in signals.observers:
        observer.spool_failed(operation)
    if operation not in _said:
        _said.add(operation)
        logger.error(
            "chatparity: the spool folder cannot be used to %s (%s): log rows the database"
            " cannot take would be lost, and the requests of a killed worker would leave no"
            " row; said once until it works again, each failure counted",
            operation,
            error,
            exc_info=error,
        )


def worked(operation: str) -> None:
    """The spool folder was used to ``operation``: said if it had :func:`failed` to."""
    if operation in _said:
        _said.discard(operation)
        logger.warning("chatparity: the spool folder can be used to %s again", operation)


def spool_path() -> Path:
    """The setting's folder, else one in the system's temporary directory per database
    the log is written to (two sites on one machine drain each their own), named with a
    keyed hash: another user cannot know its name to make it, or a link in its place,
    before the server does."""
    configured = app_settings.SPOOL_DIR
    if configured:
        return Path(configured)
    connection = connections[router.db_for_write(RequestLog)]
    database = connection.settings_dict
    where = "|".join(str(database.get(part, "")) for part in ("ENGINE", "HOST", "PORT", "NAME"))
    if isinstance(connection, SQLiteWrapper) and connection.is_in_memory_db():
        where += f"|{os.getpid()}"  # no other process sees this database
    digest = hmac.new(str(settings.SECRET_KEY).encode(), where.encode(), "sha256").hexdigest()
    return Path(tempfile.gettempdir()) / f"chatparity-spool-{os.getuid()}-{digest[:32]}"


def keep(rows: Iterable[RequestLog]) -> None:
    """Append ``rows`` to this process's spool file and fsync it."""
    now = timezone.now()
    for row in rows:
        if row.created_at is None:
            row.created_at = now
    lines = b"".join(encode(row) for row in rows)
    spool = open_folder()
    assert spool is not None  # made
    name = f"{_ROWS}{os.getpid()}{_SUFFIX}"
    while True:
        descriptor = spool.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with open(descriptor, "ab") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            # A drain may have claimed the file between open and lock: append to the
            # file that has the name now, or the rows would go with the claimed one.
            if not spool.names_file(name, descriptor):
                continue
            created = file.tell() == 0
            file.write(lines)
            file.flush()
            os.fsync(descriptor)
        if created:
            spool.sync()
        return


def drain() -> int:
    """Write every spooled row of this machine's processes that the database does not
    hold yet; how many were written. Raises the database's error while it is away
    (the files stay for the next drain)."""
    spool = open_folder(create=False)
    if spool is None:
        return 0
    return sum(_drain_file(spool, name) for name in _claimed_files(spool))


def pending() -> bool:
    """Whether any process of this machine has spooled rows not drained yet."""
    spool = open_folder(create=False)
    return spool is not None and any(name.startswith((_ROWS, _CLAIMED)) for name in spool.names())


def count() -> int:
    """How many rows the processes of this machine have spooled and not drained yet."""
    spool = open_folder(create=False)
    if spool is None:
        return 0
    rows = 0
    for name in spool.names():
        if name.startswith((_ROWS, _CLAIMED)):
            # Drained meanwhile: none left there.
            with (
                contextlib.suppress(FileNotFoundError),
                open(spool.open(name, os.O_RDONLY), "rb") as file,
            ):
                rows += sum(1 for _ in file)
    return rows


def encode(row: RequestLog) -> bytes:
    """``row`` as one JSON line."""
    values = {field.attname: field.value_from_object(row) for field in _fields()}
    return orjson.dumps(values, default=str) + b"\n"


def decode(line: bytes) -> RequestLog:
    """The row :func:`encode` wrote as ``line``."""
    values: dict[str, Any] = orjson.loads(line)
    # A row spooled before an upgrade lacks the columns added since: their defaults.
    return RequestLog(
        **{
            field.attname: field.to_python(values[field.attname])
            for field in _fields()
            if field.attname in values
        }
    )


@functools.cache
def _fields() -> list[Field[Any, Any]]:
    return [field for field in RequestLog._meta.concrete_fields if not field.primary_key]


def _claimed_files(spool: Folder) -> Iterator[str]:
    """The files to drain: each process's rows, renamed so that rows spooled from now
    on go to a new file, and files a drain claimed before and did not finish."""
    for name in sorted(spool.names()):
        if name.startswith(_CLAIMED):
            yield name
        elif name.startswith(_ROWS):
            claimed = f"{_CLAIMED}{uuid.uuid4().hex}{_SUFFIX}"
            try:
                spool.rename(name, claimed)
            except FileNotFoundError:  # another process claimed it first
                continue
            yield claimed


def _drain_file(spool: Folder, name: str) -> int:
    path = spool.path / name  # named in messages only
    try:
        with open(spool.open(name, os.O_RDONLY), "rb") as file:
            try:
                # Not waiting: a writer still appending, or another drain, holds it;
                # the next drain takes it.
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            rows = []
            for line in file.read().splitlines():
                try:
                    rows.append(decode(line))
                except orjson.JSONDecodeError:  # cut short by a crash
                    logger.error("chatparity: an unreadable spooled row in %s was skipped", path)
            written = _insert_missing(rows)
            spool.unlink(name)
    except FileNotFoundError:  # drained by another process meanwhile
        return 0
    return written


def _insert_missing(rows: list[RequestLog]) -> int:
    database = router.db_for_write(RequestLog)
    held: set[str] = set()
    for start in range(0, len(rows), _LOOKUP_CHUNK):
        ids = [row.request_id for row in rows[start : start + _LOOKUP_CHUNK]]
        found = RequestLog.objects.using(database).filter(request_id__in=ids)
        held.update(found.values_list("request_id", flat=True))
    missing = {row.request_id: row for row in rows if row.request_id not in held}
    if missing:
        inserts.insert_rows(list(missing.values()))
    return len(missing)
