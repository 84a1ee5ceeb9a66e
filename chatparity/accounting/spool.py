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
afterwards reaches nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hmac
import logging
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from django.conf import settings
from django.db import connections, router
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.db.models import Field
from django.utils import timezone

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
# Folders this process opened, by path: each is opened and checked once.
_opened: dict[str, Folder] = {}


def open_folder(*, create: bool = True) -> Folder | None:
    """The spool folder (:func:`spool_path`), made when ``create`` (else None when there
    is none), opened once and checked on what was opened: a symlink, or a folder another
    user owns or may write to, is refused (:class:`PermissionError`), since rows put
    there would be written to the log as they are, and the journals read back."""
    path = spool_path()
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
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: not a folder
        raise PermissionError(f"{path} is not a folder: chatparity will not spool there") from exc
    status = os.fstat(descriptor)
    if status.st_uid != os.getuid() or status.st_mode & 0o022:
        os.close(descriptor)
        raise PermissionError(f"{path} is not this user's alone: chatparity will not spool there")
    opened = _opened[str(path)] = Folder(path, descriptor)
    return opened


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
