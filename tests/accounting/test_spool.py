"""Log rows the database cannot take are kept on local disk and written once it can;
the requests a killed worker had in flight are logged as interrupted."""

import asyncio
import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from unittest import mock

import orjson
import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.core.asgi import get_asgi_application
from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError, connections
from django.test import AsyncRequestFactory

from chatparity.accounting import inserts, journal, spool, writer
from chatparity.accounting.record import UsageRecord
from chatparity.metrics.views import metrics
from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.protocol.events import Usage
from chatparity.transport.fastpath import FastPath
from tests import services
from tests.asgi import ask_fast_path as ask
from tests.scripted import SCRIPTED
from tests.support import routed, spools
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def spool_dir(settings, tmp_path):
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(tmp_path / "spool")}
    return tmp_path / "spool"


def a_row(request_id, **fields):
    record = UsageRecord(request_id=request_id, client_ip="203.0.113.7", user_agent="sdk/1.0")
    record.alias, record.backend, record.stream = "echo", "scripted", True
    record.usage = Usage(prompt_tokens=7, completion_tokens=5)
    row = record.row()
    for name, value in fields.items():
        setattr(row, name, value)
    return row


def stored(row):
    return {
        field.attname: getattr(row, field.attname)
        for field in RequestLog._meta.concrete_fields
        if not field.primary_key
    }


@pytest.mark.django_db(transaction=True)
def test_a_spooled_row_is_written_as_it_was_once_the_spool_is_drained(spool_dir):
    row = a_row("req-1", cost=Decimal("0.00001234"), finish_reasons=["stop", "length"])
    spool.keep([row])
    assert row.created_at is not None  # when it was first meant to be written
    assert len(list(spool_dir.glob("rows-*"))) == 1
    assert spool.pending()

    assert spool.drain() == 1
    assert stored(RequestLog.objects.get()) == stored(row)
    assert not spool.pending()
    assert list(spool_dir.iterdir()) == []


@pytest.mark.django_db(transaction=True)
def test_a_drain_cut_short_after_its_commit_writes_nothing_twice(spool_dir):
    spool.keep([a_row("req-1"), a_row("req-2")])
    inserts.insert_rows([a_row("req-1")])  # a drain that committed, then died
    assert spool.drain() == 1
    assert sorted(RequestLog.objects.values_list("request_id", flat=True)) == ["req-1", "req-2"]


@pytest.mark.django_db(transaction=True)
def test_rows_the_database_cannot_take_are_spooled_then_written_when_it_answers():
    refusals = []

    def unreachable(rows):
        refusals.append(len(rows))
        raise OperationalError("connection refused")

    async def requests_during_an_outage():
        log_writer = writer.LogWriter()
        with mock.patch.object(inserts, "insert_rows", unreachable):
            outcomes = await asyncio.gather(*(log_writer.write(a_row(f"r{i}")) for i in range(3)))
            assert outcomes == [False] * 3  # spooled, not written
            await asyncio.sleep(0.2)  # the drain tries, in vain
            assert await RequestLog.objects.acount() == 0
        await log_writer._draining  # the database answers again: the next try writes them

    with (
        mock.patch.object(writer, "SAVE_ATTEMPTS", 2),
        mock.patch.object(writer, "DRAIN_SECONDS", 0.05),
    ):
        asyncio.run(requests_during_an_outage())
    assert refusals[:2] == [3, 3]  # one batch, tried twice, then spooled
    assert len(refusals) > 2  # and drained in vain while the database was away
    ids = sorted(RequestLog.objects.values_list("request_id", flat=True))
    assert ids == ["r0", "r1", "r2"]


# Modes by who else may write: each bit of the mask alone, and every bit.
OTHERS_MAY_WRITE = pytest.mark.parametrize(
    "mode", [0o760, 0o706, 0o777], ids=["its group", "any user", "anyone at all"]
)


@OTHERS_MAY_WRITE
def test_a_spool_folder_others_may_write_to_is_refused(spool_dir, mode):
    spool_dir.mkdir()
    spool_dir.chmod(mode)
    with pytest.raises(PermissionError, match="is not this user's alone"):
        spool.open_folder()


def test_a_spool_folder_others_may_only_read_is_used(spool_dir):
    spool_dir.mkdir()
    spool_dir.chmod(0o755)
    spool.keep([a_row("req-1")])
    assert spool.count() == 1


@OTHERS_MAY_WRITE
def test_a_rows_file_others_may_write_to_is_never_appended_to(spool_dir, mode):
    spool_dir.mkdir(mode=0o700)
    planted = spool_dir / f"rows-{os.getpid()}.jsonl"
    planted.touch()
    planted.chmod(mode & 0o666)
    with pytest.raises(PermissionError, match="is not this user's alone"):
        spool.keep([a_row("req-1")])
    assert planted.read_bytes() == b""


@OTHERS_MAY_WRITE
def test_a_journal_others_may_write_to_is_never_recovered(spool_dir, mode):
    spool_dir.mkdir(mode=0o700)
    planted = spool_dir / "journal-999999.jsonl"
    planted.write_bytes(journal._begin_line(UsageRecord(request_id="req-planted")))
    planted.chmod(mode & 0o666)
    assert journal.recover() == 0
    assert planted.exists()
    assert not spool.pending()


def test_a_journal_others_may_only_read_is_recovered(spool_dir):
    spool_dir.mkdir(mode=0o700)
    left = spool_dir / "journal-999999.jsonl"
    left.write_bytes(journal._begin_line(UsageRecord(request_id="req-left")))
    left.chmod(0o755)
    assert journal.recover() == 1


KILLED_WORKER = """
import sys, time
import django
django.setup()
from django.conf import settings
settings.CHATPARITY = {"SPOOL_DIR": sys.argv[1]}
from chatparity.accounting import journal
from chatparity.accounting.record import UsageRecord

streaming = UsageRecord(request_id="req-killed", key_prefix="sk-cp-abcd", client_ip="::1")
streaming.alias, streaming.backend, streaming.stream = "echo", "scripted", True
streaming.endpoint = "responses"
journal.begin(streaming)
streaming.completion_id, streaming.completion_tokens_sent = "chatcmpl-k", 7
print("serving", flush=True)
time.sleep(60)
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("linked", [False, True], ids=["a folder", "a link to a private folder"])
def test_the_requests_a_killed_worker_had_in_flight_become_interrupted_rows(
    spool_dir, tmp_path, linked
):
    real = spool_dir
    if linked:  # the worker and this process each resolve it as they start
        real = spools.private_folder(tmp_path)
        spool_dir.symlink_to(real)
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": ROOT}
    worker = subprocess.Popen(
        [sys.executable, "-c", KILLED_WORKER, str(spool_dir)],
        stdout=subprocess.PIPE,
        env=environment,
        cwd=ROOT,
    )
    try:
        assert worker.stdout.readline() == b"serving\n"
        [its_journal] = real.glob("journal-*")
        asyncio.run(until(lambda: b'"completion_tokens":7' in its_journal.read_bytes()))
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)

    spool.open_for_serving()
    assert journal.recover() == 1
    assert spool.drain() == 1
    assert list(real.iterdir()) == []
    row = RequestLog.objects.get()
    assert (row.request_id, row.endpoint, row.key_prefix) == (
        "req-killed",
        "responses",
        "sk-cp-abcd",
    )
    assert (row.status_code, row.error_type, row.error_code) == (500, "server_error", "interrupted")
    assert (row.completion_id, row.completion_tokens, row.total_tokens) == ("chatcmpl-k", 7, 7)
    assert row.usage_counted  # the tokens it sent, as the gateway counted them
    assert (row.alias, row.backend, row.stream, row.client_ip) == ("echo", "scripted", True, "::1")


def in_flight(request_id):
    return UsageRecord(request_id=request_id, key_prefix="sk-cp-abcd")


def left_by_a_killed_worker(spool_dir, live):
    """The journal ``live``'s worker would leave if killed now: its lines as they are,
    under the name of a process that is gone, locked by no one."""
    left = spool_dir / "journal-999999.jsonl"
    left.write_bytes((spool_dir / live.name).read_bytes())
    left.chmod(0o600)
    return left


def test_a_live_workers_requests_are_its_own(spool_dir):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    live.begin(in_flight("req-streaming"))
    assert journal.recover() == 0
    assert (spool_dir / live.name).exists()
    assert not spool.pending()


def test_a_live_workers_requests_are_its_own_while_it_compacts_its_journal(spool_dir):
    # A recoverer opened the journal; the worker then compacted it (a new file under its
    # name) and closed the old one, whose lock a recoverer could now take.
    spool_dir.mkdir(mode=0o700)
    with mock.patch.object(journal, "COMPACT_BYTES", 2000):
        live = journal.Journal(spool.open_folder())
        live.begin(in_flight("req-streaming"))
        first = (spool_dir / live.name).stat().st_ino

        class CompactedMeanwhile(spool.Folder):
            def open(self, name, flags):
                descriptor = super().open(name, flags)
                for index in range(20):
                    live.begin(in_flight(f"req-{index}"))
                assert (spool_dir / live.name).stat().st_ino != first  # compacted
                return descriptor

        folder = spool.open_folder()
        assert journal.recover(CompactedMeanwhile(folder.path, folder.descriptor)) == 0
    assert (spool_dir / live.name).exists()
    assert not spool.pending()


def test_a_request_whose_row_was_written_leaves_no_interrupted_row(spool_dir):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    live.begin(in_flight("req-done"))
    live.begin(in_flight("req-streaming"))
    live.end("req-done")
    left_by_a_killed_worker(spool_dir, live)
    assert journal.recover() == 1
    [spooled] = spool_dir.glob("rows-*")
    assert spool.decode(spooled.read_bytes()).request_id == "req-streaming"


def test_a_recovered_journal_is_deleted_and_never_recovered_again(spool_dir):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    live.begin(in_flight("req-streaming"))
    left = left_by_a_killed_worker(spool_dir, live)
    assert journal.recover() == 1
    assert not left.exists()
    assert journal.recover() == 0
    assert spool.count() == 1


def test_a_journal_two_workers_recover_at_once_is_recovered_once(spool_dir):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    live.begin(in_flight("req-streaming"))
    left = left_by_a_killed_worker(spool_dir, live)
    a_dead_workers_journal(spool_dir, journal._begin_line(in_flight("req-other")), pid=999998)
    folder = spool.open_folder()

    class ThatOneOnly(spool.Folder):
        def names(self):
            return [left.name]

    class RecoveredMeanwhile(spool.Folder):
        """A recoverer that opened the journal, then another took it whole."""

        def names(self):
            return sorted(super().names(), key=lambda name: name != left.name)

        def open(self, name, flags):
            descriptor = super().open(name, flags)
            if name == left.name:
                assert journal.recover(ThatOneOnly(folder.path, folder.descriptor)) == 1
            return descriptor

    assert journal.recover(RecoveredMeanwhile(folder.path, folder.descriptor)) == 1  # the other
    assert spool.count() == 2


def test_a_request_that_ends_while_its_progress_is_noted_stays_ended(spool_dir):
    # The progress pass runs on its own thread: a request ending in the middle of it
    # was put back as open, and a journal that never shrinks made every write compact.
    spool_dir.mkdir()
    own = journal.Journal(spool.open_folder())

    class Ending(UsageRecord):
        @property
        def completion_tokens_sent(self):  # read by the pass: the request ends right then
            own.end(self.request_id)
            return 3

        @completion_tokens_sent.setter
        def completion_tokens_sent(self, value):
            pass

    own.begin(Ending(request_id="req-ending", key_prefix="sk-cp-abcd"))
    own.note_progress()
    assert own._open == {}


def test_a_journal_closed_at_exit_takes_no_more_notes(spool_dir):
    # At exit the journal's file is unmapped while the progress thread and the last
    # requests may still note: they wrote into a closed map (ValueError on a thread).
    spool_dir.mkdir()
    own = journal.Journal(spool.open_folder())
    own.begin(in_flight("req-open"))
    own.close()
    own.begin(in_flight("req-late"))
    own.note_progress()
    own.end("req-open")
    own.close()  # atexit may run it again after a test or the server did
    assert not spool_dir.exists()  # its file and folder gone, as at a clean exit


def test_a_journal_is_compacted_to_its_open_requests(spool_dir):
    spool_dir.mkdir()
    with mock.patch.object(journal, "COMPACT_BYTES", 2000):
        own = journal.Journal(spool.open_folder())
        for index in range(50):
            record = UsageRecord(request_id=f"r{index}", key_prefix="sk-cp-abcd")
            own.begin(record)
            if index != 7:
                own.end(record.request_id)
    contents = (spool_dir / own.name).read_bytes().rstrip(b"\0")
    assert len(contents) < 2000
    assert [row.request_id for row in journal.interrupted_rows(contents)] == ["r7"]


# The database of the outage test: chatparity's tables on a PostgreSQL server of our
# own, stopped and started again by the test.
OUTAGE = "outage"


@pytest.fixture(scope="module")
def postgres_we_may_stop(django_db_blocker):
    with (
        services.postgres(own=True) as server_url,  # stopped by the test
        routed.chatparity_database(server_url, OUTAGE, django_db_blocker),
    ):
        yield services.control(server_url)


def test_no_row_is_lost_over_a_postgresql_outage(
    postgres_we_may_stop, django_db_blocker, settings, spool_dir
):
    settings.DATABASE_ROUTERS = [routed.ChatparityIn(OUTAGE)]
    settings.CHATPARITY = {**settings.CHATPARITY, "CACHE_SECONDS": 0.2}
    with django_db_blocker.unblock():
        _, plaintext = ApiKey.objects.create_key("outage")
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["Hi"]}
        )
        ModelAlias.objects.create(public_id="echo", backend=backend)

    async def scenario():
        before = await asyncio.gather(*(ask(plaintext) for _ in range(3)))
        postgres_we_may_stop.stop()
        await asyncio.sleep(0.3)  # the key and alias as read are no longer fresh
        during = await asyncio.gather(*(ask(plaintext) for _ in range(10)))
        unknown = await ask("sk-cp-never-seen")
        spooled = spool.pending()
        postgres_we_may_stop.start()
        for _ in range(100):  # the spool is drained within a few seconds
            logged = await RequestLog.objects.acount()
            if logged >= 13 and not spool.pending():
                break
            await asyncio.sleep(0.2)
        return before, during, unknown, spooled

    with django_db_blocker.unblock():
        before, during, unknown, spooled = asyncio.run(scenario())
        connections[OUTAGE].close()  # this thread's, from before the outage
        request_ids = list(RequestLog.objects.values_list("request_id", flat=True))
    assert [status for status, _ in before + during] == [200] * 13  # served from the cache
    status, body = unknown
    assert (status, body["error"]["code"]) == (503, "service_unavailable")
    assert spooled
    assert len(request_ids) == len(set(request_ids)) == 13  # none lost, none twice


def test_a_worker_starting_spools_the_requests_a_dead_one_left(spool_dir):
    spool_dir.mkdir()
    left = UsageRecord(request_id="req-left", key_prefix="sk-cp-abcd")
    (spool_dir / "journal-999999.jsonl").write_bytes(journal._begin_line(left))  # no one holds it
    apps.get_app_config("chatparity").ready()
    [spooled] = spool_dir.glob("rows-*")
    assert spool.decode(spooled.read_bytes()).error_code == journal.INTERRUPTED_CODE


def test_a_journal_of_many_open_requests_is_not_rewritten_on_every_write(spool_dir):
    # Rows waiting on a busy database keep many requests open: compacting on each
    # write would rewrite them all every time (a benchmark at c=32 ran at half speed).
    spool_dir.mkdir()
    with mock.patch.object(journal, "COMPACT_BYTES", 2000):
        own = journal.Journal(spool.open_folder())
        with mock.patch.object(own, "_compact", wraps=own._compact) as compact:
            for index in range(200):
                own.begin(UsageRecord(request_id=f"r{index}", key_prefix="sk-cp-abcd"))
    assert 1 <= compact.call_count <= 10
    still_open = journal.interrupted_rows((spool_dir / own.name).read_bytes())
    assert len(still_open) == 200  # none left behind by a compaction


# Security round 3: a local user of the machine pointed the spool folder's name at a
# folder of the server's user (the check passed), then at one of theirs holding
# journal-<pid>.new as a symlink to a victim file, which the journal's next compaction
# truncated and filled; a planted 0666 rows file read the client addresses.


def test_a_spool_folder_swapped_for_a_symlink_after_its_check_reaches_nothing_else(
    spool_dir, tmp_path
):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    spool_dir.mkdir(mode=0o700)
    with mock.patch.object(journal, "COMPACT_BYTES", 2000):
        own = journal.Journal(spool.open_folder())
        kept = tmp_path / "kept-by-the-server"
        spool_dir.rename(kept)
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o777)
        theirs.chmod(0o777)
        (theirs / f"{own.name}.new").symlink_to(victim)
        planted = theirs / f"rows-{os.getpid()}.jsonl"
        planted.touch(mode=0o666)
        spool_dir.symlink_to(theirs)
        for index in range(80):  # several compactions
            own.begin(UsageRecord(request_id=f"r{index}", key_prefix="sk-cp-abcd"))
        spool.keep([a_row("req-1")])
    assert victim.read_bytes() == b"precious"
    assert planted.read_bytes() == b""
    assert sorted(path.name for path in kept.iterdir()) == [
        own.name,
        f"rows-{os.getpid()}.jsonl",
    ]


# Reliability (issue 39): a SPOOL_DIR reached through symlinks is resolved once, at
# start, when only the server's user or root can change where they lead; else refused,
# and the server does not start.


@pytest.mark.parametrize("layout", spools.RESOLVED, ids=spools.layout_id)
def test_a_spool_folder_reached_through_symlinks_no_one_else_can_change_is_resolved(
    settings, tmp_path, layout
):
    configured, real = layout(tmp_path)
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(configured)}
    assert spool.open_for_serving().path == real
    spool.keep([a_row("req-1")])
    assert [path.name for path in real.iterdir()] == [f"rows-{os.getpid()}.jsonl"]
    assert spool.count() == 1


@pytest.mark.parametrize("layout", spools.REFUSED, ids=spools.layout_id)
def test_a_spool_folder_reached_through_symlinks_others_could_change_is_refused(
    settings, tmp_path, layout
):
    configured, said = layout(tmp_path)
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(configured)}
    with pytest.raises(spool.Refused, match=re.escape(said)):
        spool.open_folder()
    with pytest.raises(ImproperlyConfigured) as refused:
        spool.open_for_serving()
    message = str(refused.value)
    assert message.startswith(f"CHATPARITY['SPOOL_DIR'] ({configured}) cannot be used")
    assert said in message
    assert message.endswith(spool.FIX)
    assert not list(tmp_path.glob("**/rows-*"))  # nothing spooled anywhere


def test_a_linked_spool_folder_is_resolved_once_wherever_the_link_comes_to_point(
    spool_dir, tmp_path
):
    first, second = spools.private_folder(tmp_path, "first"), spools.private_folder(tmp_path)
    spool_dir.symlink_to(first)
    spool.open_for_serving()
    spool_dir.unlink()
    spool_dir.symlink_to(second)
    shutil.rmtree(first)  # the folder opened is gone: opened again, where it was
    first.mkdir(mode=0o700)
    spool.keep([a_row("req-1")])
    assert len(list(first.iterdir())) == 1
    assert list(second.iterdir()) == []


def test_a_spool_folder_replaced_by_a_symlink_after_it_was_resolved_is_refused(spool_dir, tmp_path):
    spool.open_for_serving()
    spool_dir.rmdir()
    spool_dir.symlink_to(spools.private_folder(tmp_path))
    with pytest.raises(spool.Refused, match="is not a folder"):
        spool.keep([a_row("req-1")])


@pytest.fixture
def a_journal_of_its_own():
    """This process journals into a journal opened from now on."""
    with mock.patch.object(journal, "_current", None):
        yield


def an_echo_key():
    """The plaintext of a key that may ask the scripted alias ``echo``."""
    _, plaintext = ApiKey.objects.create_key("spool")
    backend = Backend.objects.create(name="scripted", kind="scripted", options={"script": ["Hi"]})
    ModelAlias.objects.create(public_id="echo", backend=backend)
    return plaintext


@pytest.mark.django_db(transaction=True)
def test_a_site_whose_spool_folder_links_to_a_private_one_serves_and_journals_there(
    spool_dir, tmp_path, a_journal_of_its_own
):
    private = spools.private_folder(tmp_path)
    spool_dir.symlink_to(private)
    plaintext = an_echo_key()
    status, _ = asyncio.run(ask(plaintext))
    assert status == 200
    assert RequestLog.objects.count() == 1
    assert (private / f"journal-{os.getpid()}.jsonl").is_file()  # through the real path
    assert spool_dir.is_symlink()


def test_a_file_planted_under_a_journals_name_is_replaced_never_written(spool_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    spool_dir.mkdir(mode=0o700)
    (spool_dir / f"journal-{os.getpid()}.jsonl").symlink_to(victim)
    own = journal.Journal(spool.open_folder())
    own.begin(UsageRecord(request_id="r1", key_prefix="sk-cp-abcd"))
    assert victim.read_bytes() == b"precious"
    assert not (spool_dir / own.name).is_symlink()


def test_the_default_folder_is_named_by_a_key_no_other_user_knows(settings):
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": None}
    default = spool.spool_path()
    settings.SECRET_KEY = "another-site-entirely-" + "x" * 40
    other = spool.spool_path()
    assert default.parent == other.parent == Path(tempfile.gettempdir())
    assert default != other
    assert default.name.startswith(f"chatparity-spool-{os.getuid()}-")


# What each line of the spool promises (found by mutation testing, bench/mutation.py).


def test_without_a_spool_folder_nothing_is_pending_counted_or_drained(spool_dir):
    assert not spool.pending()
    assert spool.count() == 0
    assert spool.drain() == 0
    assert journal.recover() == 0
    assert not spool_dir.exists()  # nor is one made to find out


def test_a_spool_folder_that_is_a_file_is_refused(spool_dir):
    spool_dir.write_bytes(b"")
    with pytest.raises(PermissionError, match="is not a folder"):
        spool.open_folder()


@spools.ANOTHER_USER
def test_a_spool_folder_another_user_made_is_refused(spool_dir, other):
    spool_dir.mkdir(mode=0o700)
    with (
        mock.patch.object(os, "getuid", return_value=os.getuid() + other),  # we are them
        pytest.raises(PermissionError, match="is not this user's alone"),
    ):
        spool.open_folder()


@spools.ANOTHER_USER
def test_a_rows_file_another_user_made_is_never_appended_to(spool_dir, other):
    spool.open_folder()
    planted = spool_dir / f"rows-{os.getpid()}.jsonl"
    planted.touch(mode=0o600)
    with (
        mock.patch.object(os, "getuid", return_value=os.getuid() + other),
        pytest.raises(PermissionError, match="is not this user's alone"),
    ):
        spool.keep([a_row("req-1")])
    assert planted.read_bytes() == b""


def test_what_the_spool_and_the_journal_make_no_other_user_may_read(spool_dir):
    spool.keep([a_row("req-1")])  # client addresses, user agents
    journal.Journal(spool.open_folder()).begin(in_flight("req-2"))
    made = [spool_dir, *spool_dir.iterdir()]
    assert len(made) == 3
    assert [(path.name, path.stat().st_mode & 0o077) for path in made] == [
        (path.name, 0) for path in made
    ]


def test_a_symlink_in_the_spool_folder_is_neither_counted_nor_drained(spool_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(spool.encode(a_row("req-planted")))
    spool_dir.mkdir(mode=0o700)
    (spool_dir / "rows-999999.jsonl").symlink_to(elsewhere)
    assert not spool.pending()
    assert spool.count() == 0
    assert spool.drain() == 0


def test_a_symlink_under_this_processs_rows_file_name_is_never_followed(spool_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    spool_dir.mkdir(mode=0o700)
    (spool_dir / f"rows-{os.getpid()}.jsonl").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic links"):  # ELOOP: O_NOFOLLOW
        spool.keep([a_row("req-1")])
    assert victim.read_bytes() == b"precious"


def test_rows_spooled_as_a_drain_claims_the_file_go_to_a_new_one(spool_dir):
    spool.keep([a_row("req-1")])
    folder = spool.open_folder()

    class ClaimedMeanwhile(spool.Folder):
        """A drain claims the rows file between keep()'s open and its lock."""

        claimed = False

        def open(self, name, flags):
            descriptor = super().open(name, flags)
            if not self.claimed:
                self.claimed = True
                self.rename(name, "claimed-meanwhile.jsonl")
            return descriptor

    meanwhile = ClaimedMeanwhile(folder.path, folder.descriptor)
    with mock.patch.dict(spool._opened, {str(spool_dir): meanwhile}):
        spool.keep([a_row("req-2")])
    claimed = (spool_dir / "claimed-meanwhile.jsonl").read_bytes()
    assert spool.decode(claimed).request_id == "req-1"
    [rows] = spool_dir.glob("rows-*")
    assert spool.decode(rows.read_bytes()).request_id == "req-2"


@pytest.mark.django_db(transaction=True)
def test_a_rows_file_a_writer_still_holds_is_left_for_the_next_drain(spool_dir):
    spool.keep([a_row("req-1")])
    [rows] = spool_dir.glob("rows-*")
    with open(rows, "rb") as appending:
        fcntl.flock(appending, fcntl.LOCK_EX)  # as keep() holds it while it writes
        assert spool.drain() == 0
    assert spool.drain() == 1
    assert RequestLog.objects.get().request_id == "req-1"


@pytest.mark.django_db(transaction=True)
def test_a_file_an_interrupted_drain_claimed_is_drained_by_the_next(spool_dir):
    spool_dir.mkdir(mode=0o700)
    claimed = spool_dir / "claimed-0123456789abcdef.jsonl"
    claimed.write_bytes(spool.encode(a_row("req-1")))
    claimed.chmod(0o600)
    assert spool.drain() == 1
    assert not claimed.exists()


@pytest.mark.django_db(transaction=True)
def test_a_drain_of_more_rows_than_one_lookup_asks_for_writes_none_twice(spool_dir):
    with mock.patch.object(spool, "_LOOKUP_CHUNK", 2):
        spool.keep([a_row(f"req-{index}") for index in range(5)])
        inserts.insert_rows([a_row("req-2"), a_row("req-3")])  # a drain that died after
        assert spool.drain() == 3
    assert RequestLog.objects.count() == 5


@pytest.mark.django_db(transaction=True)
def test_a_row_cut_short_by_a_crash_is_skipped_and_the_others_written(spool_dir, caplog):
    spool.keep([a_row("req-1"), a_row("req-2")])
    [rows] = spool_dir.glob("rows-*")
    with open(rows, "ab") as file:
        file.write(spool.encode(a_row("req-3"))[:40])  # the process was killed mid-write
    assert spool.drain() == 2
    assert "an unreadable spooled row" in caplog.text


@pytest.fixture
def a_database_in_memory_and_one_in_a_file(tmp_path):
    added = {"in_memory": ":memory:", "in_a_file": str(tmp_path / "db.sqlite3")}
    for alias, name in added.items():
        django_settings.DATABASES[alias] = {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
    connections.configure_settings(django_settings.DATABASES)
    yield
    for alias in added:
        connections[alias].close()
        del django_settings.DATABASES[alias]


def test_each_process_on_an_in_memory_database_spools_into_a_folder_of_its_own(
    settings, a_database_in_memory_and_one_in_a_file
):
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": None}

    def folders_of_two_processes(alias):
        settings.DATABASE_ROUTERS = [routed.ChatparityIn(alias)]
        mine = spool.spool_path()
        with mock.patch.object(os, "getpid", return_value=os.getpid() + 1):
            return mine, spool.spool_path()

    mine, another = folders_of_two_processes("in_memory")
    assert mine != another  # no other process sees that database
    mine, another = folders_of_two_processes("in_a_file")
    assert mine == another  # each drains what the other spooled


def test_a_spool_folder_whose_parents_are_missing_is_made_with_them(settings, tmp_path):
    nested = tmp_path / "var" / "chatparity" / "spool"
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(nested)}
    spool.keep([a_row("req-1")])
    assert spool.count() == 1


def test_this_users_folder_and_files_are_known_by_the_owners_number(spool_dir):
    # A uid past the small integers CPython shares, so that an owner compared by
    # identity rather than by number would be another user's.
    spool_dir.mkdir(mode=0o700)
    rows = spool_dir / f"rows-{os.getpid()}.jsonl"
    rows.touch(mode=0o600)
    owner = os.getuid()
    if owner == 0:  # root, as CI may run: both are given to a uid past them
        owner = 4242
        for path in (spool_dir, rows):
            os.chown(path, owner, -1)
    with mock.patch.object(os, "getuid", side_effect=lambda: int(str(owner))):
        spool.keep([a_row("req-1")])
        assert spool.count() == 1


def a_rows_file(spool_dir, name, request_id):
    """A file of spooled rows as another process of the machine leaves it."""
    path = spool_dir / name
    path.write_bytes(spool.encode(a_row(request_id)))
    path.chmod(0o600)
    return path


@pytest.mark.django_db(transaction=True)
def test_a_drain_passes_over_a_file_another_drain_claimed_first(spool_dir):
    spool_dir.mkdir(mode=0o700)
    a_rows_file(spool_dir, "rows-1.jsonl", "req-1")
    a_rows_file(spool_dir, "rows-2.jsonl", "req-2")
    folder = spool.open_folder()

    class ClaimedFirst(spool.Folder):
        def rename(self, old, new):
            if old == "rows-1.jsonl":  # another drain claims it just before this one
                super().rename(old, "claimed-by-another.jsonl")
            super().rename(old, new)

    with mock.patch.dict(
        spool._opened, {str(spool_dir): ClaimedFirst(spool_dir, folder.descriptor)}
    ):
        assert spool.drain() == 1  # rows-2's
    assert spool.drain() == 1  # the other's claim, unfinished: taken by the next drain
    assert sorted(RequestLog.objects.values_list("request_id", flat=True)) == ["req-1", "req-2"]


@pytest.mark.django_db(transaction=True)
def test_a_drain_passes_over_a_file_another_drain_finished_first(spool_dir):
    spool_dir.mkdir(mode=0o700)
    a_rows_file(spool_dir, "claimed-left.jsonl", "req-1")  # an interrupted drain's
    folder = spool.open_folder()

    class FinishedFirst(spool.Folder):
        def open(self, name, flags):
            if name == "claimed-left.jsonl":  # another drain takes it whole meanwhile
                with mock.patch.dict(spool._opened, {str(spool_dir): folder}):
                    assert spool.drain() == 1
            return super().open(name, flags)

    with mock.patch.dict(
        spool._opened, {str(spool_dir): FinishedFirst(spool_dir, folder.descriptor)}
    ):
        assert spool.drain() == 0
    assert RequestLog.objects.get().request_id == "req-1"


# What each line of the journal promises (found by mutation testing, bench/mutation.py).


def test_an_interrupted_row_lasts_from_its_request_s_start_to_its_last_progress(spool_dir):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    streaming = in_flight("req-streaming")
    streaming.started -= 2.0  # admitted two seconds ago
    live.begin(streaming)
    streaming.completion_tokens_sent = 1  # its first token
    live.note_progress()
    left_by_a_killed_worker(spool_dir, live)
    assert journal.recover() == 1
    [spooled] = spool_dir.glob("rows-*")
    row = spool.decode(spooled.read_bytes())
    assert row.completion_tokens == 1
    assert 1900 < row.duration_ms < 2900
    assert abs(row.created_at.timestamp() - time.time()) < 1  # when last heard of


def test_a_journal_line_cut_short_by_a_kill_is_passed_over(spool_dir):
    lines = journal._begin_line(in_flight("req-1")) + journal._begin_line(in_flight("req-2"))
    rows = journal.interrupted_rows(lines[:-20])  # killed while writing the second
    assert [row.request_id for row in rows] == ["req-1"]


@pytest.fixture
def no_journal_yet(spool_dir):
    spool_dir.mkdir(mode=0o700)
    with mock.patch.object(journal, "_current", None):
        yield


def test_a_process_journals_into_one_journal_for_its_whole_life(no_journal_yet):
    assert journal.current() is journal.current()


@pytest.mark.parametrize("other", [-1, 1], ids=["a lower pid", "a higher pid"])
def test_a_process_forked_from_this_one_journals_into_a_journal_of_its_own(
    no_journal_yet, spool_dir, other
):
    parent = journal.current()
    journal.begin(in_flight("req-parents"))
    before = (spool_dir / parent.name).read_bytes()
    with mock.patch.object(os, "getpid", return_value=os.getpid() + other):  # the child
        journal.end("req-parents")  # a request it did not begin: not its to end
        journal.begin(in_flight("req-childs"))
        assert journal.current().name == f"journal-{os.getpid()}.jsonl" != parent.name
    assert (spool_dir / parent.name).read_bytes() == before


def test_a_request_ended_through_the_module_leaves_no_interrupted_row(no_journal_yet, spool_dir):
    journal.begin(in_flight("req-done"))
    journal.end("req-done")
    left_by_a_killed_worker(spool_dir, journal.current())
    assert journal.recover() == 0


def test_a_request_that_sent_nothing_since_its_last_note_is_not_noted_again(spool_dir):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    streaming = in_flight("req-streaming")
    live.begin(streaming)
    streaming.completion_tokens_sent = 3

    def journalled():
        return (spool_dir / live.name).read_bytes().rstrip(b"\0")

    live.note_progress()
    noted = journalled()
    live.note_progress()
    assert journalled() == noted


def test_a_journal_another_recoverer_took_meanwhile_is_passed_over_for_the_next(spool_dir):
    spool_dir.mkdir(mode=0o700)
    for pid in (999998, 999999):
        left = spool_dir / f"journal-{pid}.jsonl"
        left.write_bytes(journal._begin_line(in_flight(f"req-{pid}")))
        left.chmod(0o600)
    folder = spool.open_folder()

    class TakenMeanwhile(spool.Folder):
        def open(self, name, flags):
            if name == "journal-999998.jsonl":  # recovered by another process meanwhile
                self.unlink(name)
            return super().open(name, flags)

    assert journal.recover(TakenMeanwhile(spool_dir, folder.descriptor)) == 1
    [spooled] = spool_dir.glob("rows-*")
    assert spool.decode(spooled.read_bytes()).request_id == "req-999999"


def a_dead_workers_journal(spool_dir, *lines, pid=999999):
    """A journal holding ``lines``, as a worker that was killed left it."""
    left = spool_dir / f"journal-{pid}.jsonl"
    left.write_bytes(b"".join(lines))
    left.chmod(0o600)
    return left


def the_interrupted_row(spool_dir):
    assert journal.recover() == 1
    [spooled] = spool_dir.glob("rows-*")
    return spool.decode(spooled.read_bytes())


def test_a_request_killed_before_any_progress_note_is_a_row_of_no_time_and_no_tokens(spool_dir):
    spool_dir.mkdir(mode=0o700)
    a_dead_workers_journal(spool_dir, journal._begin_line(in_flight("req-1")))
    row = the_interrupted_row(spool_dir)
    assert (row.completion_tokens, row.completion_id, row.duration_ms) == (0, "", 0)


def test_an_interrupted_row_never_lasts_less_than_nothing(spool_dir):
    # The machine's clock set back between the request's start and its last note.
    spool_dir.mkdir(mode=0o700)
    begin = journal._begin_line(in_flight("req-1"))
    noted = {"progress": "req-1", "seen": orjson.loads(begin)["at"] - 5, "completion_tokens": 2}
    a_dead_workers_journal(spool_dir, begin, orjson.dumps(noted) + b"\n")
    assert the_interrupted_row(spool_dir).duration_ms == 0


def test_a_requests_completion_id_is_noted_before_its_first_token(spool_dir):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    waiting = in_flight("req-waiting")
    live.begin(waiting)
    waiting.completion_id = "chatcmpl-waiting"  # the backend has not answered yet
    live.note_progress()
    left_by_a_killed_worker(spool_dir, live)
    assert the_interrupted_row(spool_dir).completion_id == "chatcmpl-waiting"


def test_recovery_goes_past_every_file_it_leaves_alone(spool_dir, caplog):
    spool_dir.mkdir(mode=0o700)
    live = journal.Journal(spool.open_folder())
    live.begin(in_flight("req-live"))
    spool.keep([a_row("req-spooled")])
    a_dead_workers_journal(spool_dir, b"", pid=999997).chmod(0o666)  # not this user's
    a_dead_workers_journal(spool_dir, journal._begin_line(in_flight("req-dead")))
    folder = spool.open_folder()

    class DeadLast(spool.Folder):
        def names(self):
            return sorted(super().names(), key=lambda name: name == "journal-999999.jsonl")

    with caplog.at_level(logging.WARNING, "chatparity.accounting.journal"):
        assert journal.recover(DeadLast(spool_dir, folder.descriptor)) == 1
    assert "1 requests of stopped workers spooled as interrupted" in caplog.text


def test_nothing_recovered_is_nothing_said(spool_dir, caplog):
    spool_dir.mkdir(mode=0o700)
    with caplog.at_level(logging.WARNING, "chatparity.accounting.journal"):
        assert journal.recover() == 0
    assert caplog.records == []


def test_ending_a_request_before_any_journal_was_opened_does_nothing(no_journal_yet):
    journal.end("req-never-begun")


def test_a_journal_that_cannot_be_written_loses_its_notes_never_the_request(
    settings, tmp_path, caplog
):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_bytes(b"")
    settings.CHATPARITY = {**SCRIPTED, "SPOOL_DIR": str(in_the_way / "spool")}
    with mock.patch.object(journal, "_current", None), caplog.at_level(logging.ERROR):
        journal.begin(in_flight("req-1"))
    assert "request req-1 was not journalled" in caplog.text


def test_a_journal_that_can_no_longer_be_written_loses_its_notes_never_the_request(
    no_journal_yet, spool_dir, caplog
):
    begin = journal._begin_line(in_flight("req-1"))
    with mock.patch.object(journal, "COMPACT_BYTES", len(begin) + 5):  # no room for its end
        journal.begin(in_flight("req-1"))
        for path in spool_dir.iterdir():
            path.unlink()
        spool_dir.rmdir()  # its folder gone: the compaction cannot make a file
        with caplog.at_level(logging.ERROR):
            journal.end("req-1")
    assert "the end of request req-1 was not journalled" in caplog.text


# Reliability (issue 39): a spool folder that becomes unusable while the server serves
# is said once and counted; requests, their rows and the scrape go on.


@pytest.fixture
def metrics_observed():
    with spools.failures_counted():
        yield


def said(caplog, level, words):
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == level and words in record.getMessage()
    ]


@pytest.mark.django_db(transaction=True)
def test_a_spool_folder_unusable_while_serving_is_said_once_and_counted_never_raised(
    settings, spool_dir, tmp_path, caplog, a_journal_of_its_own, metrics_observed
):
    private = spools.private_folder(tmp_path)
    spool_dir.symlink_to(private)
    settings.CHATPARITY = {**settings.CHATPARITY, "METRICS": {"ALLOWED_NETWORKS": ["127.0.0.1"]}}
    plaintext = an_echo_key()
    drains, counts = spools.spool_errors("drain"), spools.spool_errors("count")

    async def serve(application, requests):
        """``requests`` requests one after another, each batch's drain awaited."""
        statuses = []
        for _ in range(requests):
            status, _ = await ask(plaintext, application)
            statuses.append(status)
            draining = writer._writers.get()._draining
            if draining is not None:
                await draining  # raises nothing, whatever the spool
        return statuses

    async def scrape():
        request = AsyncRequestFactory().get("/metrics")
        return await metrics(request)

    async def serving():
        application = FastPath(get_asgi_application())  # the folder resolved and opened
        before = await serve(application, 1)
        shutil.rmtree(private)
        private.mkdir()
        private.chmod(0o777)  # made again, by someone, for anyone to write to
        during = await serve(application, 3)
        scrapes = [await scrape(), await scrape()]
        private.chmod(0o700)  # mended
        after = await serve(application, 1)
        return before + during + after, scrapes

    with (
        mock.patch.object(writer, "SPOOL_LOOK_SECONDS", 0),  # a drain after each batch
        caplog.at_level(logging.WARNING, "chatparity.accounting.spool"),
    ):
        statuses, scrapes = asyncio.run(serving())

    assert statuses == [200] * 5
    assert RequestLog.objects.count() == 5  # every row written to the database
    assert [response.status_code for response in scrapes] == [200, 200]
    exposition = scrapes[-1].content.decode()
    assert "chatparity_log_rows_spooled" not in exposition  # not known, not zero
    assert 'chatparity_dependency_up{dependency="database"} 1.0' in exposition
    assert spools.spool_errors("drain") - drains == 3  # one for each drain while it was unusable
    assert spools.spool_errors("count") - counts == 2  # and for each scrape
    [drain_error] = said(caplog, logging.ERROR, "cannot be used to drain")
    assert "other users may write to it" in drain_error
    assert len(said(caplog, logging.ERROR, "cannot be used to count")) == 1
    assert said(caplog, logging.WARNING, "can be used to drain again")


def test_a_drain_that_would_die_of_anything_else_is_said_and_counted(caplog, metrics_observed):
    def broken():
        raise RuntimeError("a bug")

    async def drain_once():
        log_writer = writer.LogWriter()
        log_writer._drain_soon()
        await log_writer._draining  # raises nothing
        return log_writer

    drains = spools.spool_errors("drain")
    with mock.patch.object(writer, "_recover_and_drain", broken), caplog.at_level(logging.ERROR):
        log_writer = asyncio.run(drain_once())
    assert log_writer._draining is None  # the next look starts another
    assert spools.spool_errors("drain") - drains == 1
    assert said(caplog, logging.ERROR, "cannot be used to drain (a bug)")


@pytest.mark.django_db(transaction=True)
def test_a_failed_recovery_leaves_the_drain_to_write_what_it_can(
    spool_dir, caplog, metrics_observed
):
    spool.keep([a_row("req-1")])

    def unwritable(folder=None):
        raise OSError(28, "No space left on device")

    drains = spools.spool_errors("drain")
    with mock.patch.object(journal, "recover", unwritable), caplog.at_level(logging.ERROR):
        assert writer._recover_and_drain() is False  # nothing left to drain
    assert RequestLog.objects.get().request_id == "req-1"
    assert spools.spool_errors("drain") - drains == 1
    assert said(caplog, logging.ERROR, "No space left on device")
