"""Log rows kept on local disk while the database cannot take them, written when it can.

Each process appends the rows it could not write to a file of its own in the spool
folder (``CHATPARITY["SPOOL_DIR"]``), one JSON line per row, fsynced before the
request's write returns. Any process of the machine drains every file: it claims
the file by renaming it, writes the rows the database does not hold yet (known by
their ``request_id``, so a drain cut short between its commit and the file's removal
writes nothing twice), then deletes the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
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


def folder(*, create: bool = True) -> Path:
    """The spool folder: the setting's, else one in the system's temporary directory
    per database the log is written to (two sites on one machine drain each their own);
    made when ``create``.

    Refused (:class:`PermissionError`) when another user owns it or may write to it:
    rows put there would be written to the log as they are.
    """
    configured = app_settings.SPOOL_DIR
    if configured:
        path = Path(configured)
    else:
        connection = connections[router.db_for_write(RequestLog)]
        database = connection.settings_dict
        where = "|".join(str(database.get(part, "")) for part in ("ENGINE", "HOST", "PORT", "NAME"))
        if isinstance(connection, SQLiteWrapper) and connection.is_in_memory_db():
            where += f"|{os.getpid()}"  # no other process sees this database
        digest = hashlib.sha256(where.encode()).hexdigest()[:16]
        path = Path(tempfile.gettempdir()) / f"chatparity-spool-{digest}"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif not path.exists():
        return path
    status = path.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o022:
        raise PermissionError(f"{path} is not this user's alone: chatparity will not spool there")
    return path


def keep(rows: Iterable[RequestLog]) -> None:
    """Append ``rows`` to this process's spool file and fsync it."""
    now = timezone.now()
    for row in rows:
        if row.created_at is None:
            row.created_at = now
    lines = b"".join(encode(row) for row in rows)
    path = folder() / f"{_ROWS}{os.getpid()}{_SUFFIX}"
    while True:
        with open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            # A drain may have claimed the file between open and lock: append to the
            # file that has the name now, or the rows would go with the claimed one.
            if not _is_named(file.fileno(), path):
                continue
            created = file.tell() == 0
            file.write(lines)
            file.flush()
            os.fsync(file.fileno())
        if created:
            _sync_folder(path.parent)
        return


def drain() -> int:
    """Write every spooled row of this machine's processes that the database does not
    hold yet; how many were written. Raises the database's error while it is away
    (the files stay for the next drain)."""
    written, spool = 0, folder(create=False)
    if not spool.exists():
        return 0
    for path in _claimed_files(spool):
        written += _drain_file(path)
    return written


def pending() -> bool:
    """Whether any process of this machine has spooled rows not drained yet."""
    spool = folder(create=False)
    return spool.exists() and any(
        entry.name.startswith((_ROWS, _CLAIMED)) for entry in os.scandir(spool)
    )


def count() -> int:
    """How many rows the processes of this machine have spooled and not drained yet."""
    spool = folder(create=False)
    if not spool.exists():
        return 0
    rows = 0
    for entry in os.scandir(spool):
        if entry.name.startswith((_ROWS, _CLAIMED)):
            # Drained meanwhile: none left there.
            with contextlib.suppress(FileNotFoundError), open(entry.path, "rb") as file:
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


def _is_named(descriptor: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


def _sync_folder(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _claimed_files(spool: Path) -> Iterator[Path]:
    """The files to drain: each process's rows, renamed so that rows spooled from now
    on go to a new file, and files a drain claimed before and did not finish."""
    for entry in sorted(os.scandir(spool), key=lambda entry: entry.name):
        if entry.name.startswith(_CLAIMED):
            yield Path(entry.path)
        elif entry.name.startswith(_ROWS):
            claimed = spool / f"{_CLAIMED}{uuid.uuid4().hex}{_SUFFIX}"
            try:
                os.rename(entry.path, claimed)
            except FileNotFoundError:  # another process claimed it first
                continue
            yield claimed


def _drain_file(path: Path) -> int:
    try:
        with open(path, "rb") as file:
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
                except (orjson.JSONDecodeError, KeyError):  # cut short by a crash
                    logger.error("chatparity: an unreadable spooled row in %s was skipped", path)
            written = _insert_missing(rows)
            path.unlink(missing_ok=True)
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
