"""Real PostgreSQL and Redis servers for tests and the load script: the ones in
``DATABASE_URL`` / ``REDIS_URL`` when set (CI's second pass), else our own, on
loopback, in a temporary folder, stopped afterwards."""

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen | None = None) -> None:
    for _ in range(200):
        with closing(socket.socket()) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


@dataclass
class Control:
    """What a chaos test may do to a server this module started: stop it, start it
    again (same port, same data), freeze and thaw its process (SIGSTOP, SIGCONT)."""

    stop: Callable[[], None]
    start: Callable[[], None]
    pid: Callable[[], int]

    def freeze(self) -> None:
        os.kill(self.pid(), signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid(), signal.SIGCONT)


_controls: dict[str, Control] = {}


def control(url: str) -> Control | None:
    """The control of the server at ``url`` (a URL :func:`redis` or :func:`postgres`
    yielded, or one of its databases); None for servers of the environment."""
    return _controls.get(url.rsplit("/", 1)[0])


@contextmanager
def redis(*, own: bool = False) -> Iterator[str]:
    """A Redis URL; ``own``: a server of our own (with a :func:`control`) even when
    ``REDIS_URL`` is set."""
    if os.environ.get("REDIS_URL") and not own:
        yield os.environ["REDIS_URL"]
        return
    server = shutil.which("redis-server")
    assert server, "redis-server is needed (apt install redis-server; .ci/run installs it)"
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        processes = []

        def start() -> None:
            process = subprocess.Popen([*command, "--dir", folder], stdout=subprocess.DEVNULL)
            processes.append(process)
            _wait_for_port(port, process)

        def stop() -> None:
            os.kill(processes[-1].pid, signal.SIGCONT)  # a frozen server cannot stop
            processes[-1].terminate()
            processes[-1].wait(timeout=10)

        url = f"redis://127.0.0.1:{port}/0"
        _controls[url.rsplit("/", 1)[0]] = Control(stop, start, lambda: processes[-1].pid)
        start()
        try:
            yield url
        finally:
            _controls.pop(url.rsplit("/", 1)[0])
            if processes[-1].poll() is None:
                stop()


@contextmanager
def postgres(*, own: bool = False) -> Iterator[str]:
    """A PostgreSQL server URL (its ``postgres`` database, as a superuser); ``own``: a
    server of our own (with a :func:`control`) even when ``DATABASE_URL`` names one."""
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")) and not own:
        yield url
        return
    binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    assert binaries, "PostgreSQL is needed (apt install postgresql; .ci/run installs it)"
    bin_dir = Path(binaries[-1])
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="chatparity-pg-"))
    as_postgres = []
    if os.getuid() == 0:  # initdb refuses to run as root
        shutil.chown(folder, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    run = [*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(folder / "data")]
    subprocess.run(
        [*as_postgres, str(bin_dir / "initdb"), "-D", str(folder / "data"), "-A", "trust",
         "-U", "postgres"],
        check=True, capture_output=True,
    )  # fmt: skip
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    options += " -c max_connections=300"

    def start() -> None:
        subprocess.run(
            [*run, "-l", str(folder / "log"), "-w", "-o", options, "start"],
            check=True, capture_output=True,
        )  # fmt: skip

    start()
    url = f"postgres://postgres@127.0.0.1:{port}/postgres"
    _controls[url.rsplit("/", 1)[0]] = Control(
        stop=lambda: subprocess.run([*run, "-m", "fast", "-w", "stop"], capture_output=True),
        start=start,
        pid=lambda: int((folder / "data" / "postmaster.pid").read_text().split()[0]),
    )
    try:
        yield url
    finally:
        _controls.pop(url.rsplit("/", 1)[0])
        subprocess.run([*run, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """A new, empty database on the server; its URL."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}"
