"""Each process's requests in flight, on local disk: the requests of a worker that is
killed are logged by the next process to start on the machine.

A process writes a line to its journal (in the spool folder) when a request is
admitted, with what its row needs (the prompt it reserved, which it is charged if it
never ends: :mod:`~chatparity.accounting.settlement`); every second, the tokens each
open request has sent and the calls it made upstream; and a line when its row is
written or spooled. The journal is a file mapped into memory: a line is a copy into
the kernel's page cache, which a killed process cannot take back (as a ``write(2)``,
which cost 14 µs per request here where the copy costs 3; no fsync either way: the
machine staying up is the premise). The process holds a lock on its journal while it
lives, so a journal whose lock can be taken is a dead process's: :func:`recover`
spools its open requests as rows marked interrupted.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import logging
import mmap
import os
import threading
import time
from typing import Any

import orjson

from ..models import Endpoint, Prices, RequestLog
from ..protocol.events import Usage
from . import spool
from .record import UsageRecord, fit_columns, ip_address
from .settlement import settled_usage

logger = logging.getLogger(__name__)

_PREFIX = "journal-"
_SUFFIX = ".jsonl"
# Seconds between two notes of the tokens that open requests have sent.
PROGRESS_SECONDS = 1.0
# A journal's size: once full it is rewritten with its open requests alone, so what a
# process that exits without cleaning up (a multiprocessing worker ends with
# os._exit) leaves behind stays small.
COMPACT_BYTES = 64 * 1024
# What a row of an interrupted request says.
INTERRUPTED_STATUS = 500
INTERRUPTED_CODE = "interrupted"


class Journal:
    """One process's journal, locked for as long as the process lives, in the spool
    folder (its files made, renamed and deleted relative to it: :class:`spool.Folder`)."""

    def __init__(self, folder: spool.Folder) -> None:
        self.pid = os.getpid()
        self.folder = folder
        self.name = f"{_PREFIX}{self.pid}{_SUFFIX}"
        self._file = _MappedFile(folder, self.name, COMPACT_BYTES)
        # id -> (record, the tokens last noted, -1 before the first note)
        self._open: dict[str, tuple[UsageRecord, int]] = {}
        self._lock = threading.RLock()
        self._progress: threading.Thread | None = None
        atexit.register(self._close)

    def begin(self, record: UsageRecord) -> None:
        """Note ``record``'s request as admitted."""
        with self._lock:
            self._open[record.request_id] = (record, -1)
            self._write(_begin_line(record))
        if self._progress is None:
            self._progress = threading.Thread(
                target=self._note_progress, name="chatparity-journal", daemon=True
            )
            self._progress.start()

    def end(self, request_id: str) -> None:
        """Note that the request's row is written (or spooled)."""
        with self._lock:
            if self._open.pop(request_id, None) is not None:
                self._write(orjson.dumps({"end": request_id}) + b"\n")

    def _close(self) -> None:
        """At a normal exit: its requests are over (the server waited for them)."""
        with self._lock:
            self.folder.unlink(self.name)
            self._file.close()
        with contextlib.suppress(OSError):  # not empty: other processes' files
            self.folder.path.rmdir()  # a folder only: a symlink put there stays

    def _note_progress(self) -> None:
        while True:
            time.sleep(PROGRESS_SECONDS)
            self.note_progress()

    def note_progress(self) -> None:
        """Journal the tokens sent by the requests still open. Under the lock, so a
        request that ends meanwhile is never put back (the journal would grow, and
        each compaction rewrite it, for the rest of the process's life)."""
        with self._lock:
            lines = []
            for request_id, (record, noted) in list(self._open.items()):
                sent = record.completion_tokens_sent
                if sent != noted and request_id in self._open:
                    lines.append(_progress_line(record))
                    self._open[request_id] = (record, sent)
            if lines:
                self._write(b"".join(lines))

    def _write(self, data: bytes) -> None:
        with self._lock:
            if not self._file.append(data):
                self._compact(data)

    def _compact(self, data: bytes) -> None:
        """Rewrite the journal with its open requests alone, then ``data`` (lock held).
        Many requests open at once (rows waiting on a busy database): the new file
        has room for as much again, or every write would rewrite them all."""
        kept = b"".join(
            _begin_line(record) + _progress_line(record) for record, _ in self._open.values()
        )
        fresh = _MappedFile(self.folder, f"{self.name}.new", max(COMPACT_BYTES, 2 * len(kept)))
        fresh.append(kept)
        self.folder.rename(fresh.name, self.name)
        self._file.close()
        self._file = fresh
        if not fresh.append(data):  # one line larger than all the open requests
            self._compact(data)


class _MappedFile:
    """A new file ``name`` in ``folder``, locked, of ``capacity`` bytes, mapped into
    memory and filled from the start; the bytes not yet written are zeros."""

    def __init__(self, folder: spool.Folder, name: str, capacity: int) -> None:
        self.name = name
        self.size = 0
        self._descriptor = folder.create(name)
        fcntl.flock(self._descriptor, fcntl.LOCK_EX)
        os.ftruncate(self._descriptor, capacity)
        self._map = mmap.mmap(self._descriptor, capacity)

    def append(self, data: bytes) -> bool:
        """Write ``data`` after what was written; False (nothing written) if it does
        not fit."""
        end = self.size + len(data)
        if end > len(self._map):
            return False
        self._map[self.size : end] = data
        self.size = end
        return True

    def close(self) -> None:
        self._map.close()
        os.close(self._descriptor)


def _begin_line(record: UsageRecord) -> bytes:
    begun = time.time() - (time.perf_counter() - record.started)
    alias = record.model_alias
    facts = {
        "begin": record.request_id,
        "at": begun,
        "endpoint": record.endpoint,
        "api_key_id": record.api_key.pk if record.api_key is not None else None,
        "key_prefix": record.key_prefix,
        "alias": record.alias,
        "backend": record.backend,
        "upstream_model": record.upstream_model,
        "stream": record.stream,
        "n": record.n,
        "client_ip": record.client_ip,
        "user_agent": record.user_agent,
        # What it is charged if it never ends: its prompt, at the alias's prices.
        "prompt_tokens": record.reserved_prompt,
        "prices": alias.prices.journalled if alias else None,
    }
    return orjson.dumps(facts) + b"\n"


def _progress_line(record: UsageRecord) -> bytes:
    progress = {
        "progress": record.request_id,
        "seen": time.time(),
        "completion_id": record.completion_id,
        "completion_tokens": record.completion_tokens_sent,
        "prompts": [
            None if call is None else [call.prompt_tokens, *_cache_tokens(call)]
            for call in record.upstream.prompts
        ],
    }
    return orjson.dumps(progress) + b"\n"


def _cache_tokens(usage: Usage) -> tuple[int, int, int]:
    return usage.cached_tokens, usage.cache_write_5m_tokens, usage.cache_write_1h_tokens


def _announced(call: int | list[int] | None) -> Usage | None:
    """A call's usage as a progress line noted it: its prompt then its cache reads and
    writes (an older journal's: its prompt alone)."""
    if call is None or isinstance(call, int):
        return None if call is None else Usage(call, 0)
    prompt, cached, write_5m, write_1h = call
    return Usage(prompt, 0, cached, cache_write_5m_tokens=write_5m, cache_write_1h_tokens=write_1h)


_current: Journal | None = None
_opening = threading.Lock()


def current() -> Journal:
    """This process's journal, opened on first use (in the process that uses it, not
    one it was forked from), after the journals of dead processes were recovered."""
    global _current
    journal = _current
    if journal is None or journal.pid != os.getpid():
        with _opening:
            journal = _current
            if journal is None or journal.pid != os.getpid():
                folder = spool.open_folder()
                assert folder is not None  # made
                recover(folder)
                journal = _current = Journal(folder)
    return journal


def begin(record: UsageRecord) -> None:
    """Note ``record``'s request as in flight; a journal that cannot be written is
    logged, never raised."""
    try:
        current().begin(record)
    except OSError:
        logger.exception("chatparity: request %s was not journalled", record.request_id)


def end(request_id: str) -> None:
    """Note that the request's row is written or spooled."""
    journal = _current
    if journal is not None and journal.pid == os.getpid():
        try:
            journal.end(request_id)
        except OSError:
            logger.exception("chatparity: the end of request %s was not journalled", request_id)


def recover(folder: spool.Folder | None = None) -> int:
    """Spool a row marked interrupted for each open request in the journals of dead
    processes, then delete those journals; how many rows were spooled."""
    folder = folder or spool.open_folder(create=False)
    if folder is None:
        return 0
    recovered = 0
    for name in folder.names():
        if not name.startswith(_PREFIX):
            continue
        try:
            descriptor = folder.open(name, os.O_RDONLY)
        except FileNotFoundError:  # recovered by another process meanwhile
            continue
        except OSError:  # a symlink, or a file another user may write: not a journal
            logger.warning("chatparity: %s is not this user's journal: left alone", name)
            continue
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its process is alive
                continue
            # Since it was opened, another process recovered it, or its live process
            # compacted it (a new file under its name) and let go of this one.
            if not folder.names_file(name, descriptor):
                continue
            with open(descriptor, "rb", closefd=False) as file:
                rows = interrupted_rows(file.read())
            if rows:
                spool.keep(rows)
            folder.unlink(name)
            recovered += len(rows)
        finally:
            os.close(descriptor)
    if recovered:
        logger.warning(
            "chatparity: %d requests of stopped workers spooled as interrupted", recovered
        )
    return recovered


def interrupted_rows(journal: bytes) -> list[RequestLog]:
    """The rows of the requests ``journal`` holds open."""
    open_requests: dict[str, dict[str, Any]] = {}
    for line in journal.rstrip(b"\0").splitlines():  # the zeros: room not written yet
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:  # the last line of a process killed mid-write
            continue
        if "begin" in entry:
            open_requests[entry["begin"]] = entry
        elif "progress" in entry and entry["progress"] in open_requests:
            open_requests[entry["progress"]].update(entry)
        elif "end" in entry:
            open_requests.pop(entry["end"], None)
    return [_interrupted_row(request_id, facts) for request_id, facts in open_requests.items()]


def _interrupted_row(request_id: str, facts: dict[str, Any]) -> RequestLog:
    begun, last = facts["at"], facts.get("seen", facts["at"])
    # Settled as a request that never ended: the prompt of each call it made upstream (one
    # when none was noted yet), the completion it had sent.
    usage = settled_usage(
        facts.get("prompt_tokens", 0),
        [_announced(call) for call in facts.get("prompts", ())],
        None,
        facts.get("completion_tokens", 0),
        answered=True,
    )
    prices = facts.get("prices")
    row = RequestLog(
        endpoint=facts.get("endpoint", Endpoint.CHAT_COMPLETIONS),
        request_id=request_id,
        completion_id=facts.get("completion_id", ""),
        api_key_id=facts["api_key_id"],
        key_prefix=facts["key_prefix"],
        alias=facts["alias"],
        backend=facts["backend"],
        upstream_model=facts["upstream_model"],
        stream=facts["stream"],
        n=facts["n"],
        status_code=INTERRUPTED_STATUS,
        error_type="server_error",
        error_code=INTERRUPTED_CODE,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        cached_tokens=usage.cached_tokens,
        cache_write_5m_tokens=usage.cache_write_5m_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
        usage_counted=True,  # what the gateway counted as sent, not what the backend said
        cost=Prices.from_journal(prices).cost_of(usage) if prices else 0,
        duration_ms=max(last - begun, 0.0) * 1000,
        client_ip=ip_address(facts["client_ip"]),  # checked here: it costs microseconds
        user_agent=facts["user_agent"],
        created_at=datetime.datetime.fromtimestamp(last, tz=datetime.UTC),
    )
    return fit_columns(row)
