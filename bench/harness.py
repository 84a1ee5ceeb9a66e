"""Shared benchmark plumbing: tools, servers, the chatparity database, and wrk.

Used by ``bench/run.py`` (the benchmark) and ``bench/hotpath.py`` (the profile).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PYTHON = sys.executable
STUB_MODEL = "stub-model"
ASGI_APP = "project.asgi:application"
UVICORN_QUIET = ("--no-access-log", "--log-level", "warning")
CHUNKS = 20

# Pinned: the version issue 28 measured against (`pip install 'litellm[proxy]'` then).
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = BENCH / ".venv-litellm"
# matplotlib for the chart and py-spy for the profile, kept out of the project's venv.
TOOLS_VENV = BENCH / ".venv-tools"
TOOLS = ("matplotlib==3.11.2", "py-spy==0.4.3")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- tools ----------------------------------------------------------------------


def ensure_wrk() -> str:
    """wrk's path, installing the Debian package when running as root."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("wrk is missing: apt-get install -y wrk")
        install = ["apt-get", "install", "-y", "-q", "wrk"]
        if subprocess.run(install, stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], stdout=subprocess.DEVNULL, check=True)
            subprocess.run(install, stdout=subprocess.DEVNULL, check=True)
        found = shutil.which("wrk")
    if not found:
        sys.exit("The benchmark needs wrk: sudo apt-get install -y wrk (Debian/Ubuntu).")
    return found


def ensure_venv(path: Path, requirements: list[str], check: str) -> Path:
    """A venv at ``path`` with ``requirements``; ``check`` is a module or script in it."""
    python = path / "bin" / "python"
    marker = path / ".bench-requirements"
    wanted = "\n".join(requirements)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    log(f"Creating {path.relative_to(ROOT)} with {' '.join(requirements)} (once)...")
    if not python.exists():
        subprocess.run([PYTHON, "-m", "venv", str(path)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *requirements], check=True)
    if not (path / "bin" / check).exists():
        subprocess.run([str(python), "-c", f"import {check}"], check=True)
    marker.write_text(wanted)
    return python


def ensure_litellm() -> Path:
    """The ``litellm`` proxy command, from a venv of its own (pinned version)."""
    ensure_venv(LITELLM_VENV, [f"litellm[proxy]=={LITELLM_VERSION}"], "litellm")
    return LITELLM_VENV / "bin" / "litellm"


def ensure_tools() -> Path:
    """The Python of the tools venv (matplotlib, py-spy)."""
    return ensure_venv(TOOLS_VENV, list(TOOLS), "py-spy")


def package_version(python: Path | str, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    run = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return run.stdout.strip() or "not installed"


def raise_file_limit() -> None:
    """Let this process and its children open thousands of sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


# -- processes ------------------------------------------------------------------


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` in KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def thread_count(pid: int) -> int:
    """Threads of ``pid``, from /proc."""
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def wait_until_up(url: str, process: subprocess.Popen[bytes], headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@contextmanager
def serve(
    command: list[str],
    url: str,
    headers: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    log_file: Path | None = None,
    cwd: Path = ROOT,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (its own process group) until ``url`` answers 200; stop it after."""
    output = log_file.open("ab") if log_file else subprocess.DEVNULL
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_up(url, process, headers or {})
        yield process
    finally:
        try:
            os.killpg(process.pid, 15)
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
        except ProcessLookupError:
            pass
        if log_file:
            output.close()  # type: ignore[union-attr]


def stub_command(port: int, *extra: str) -> list[str]:
    return [PYTHON, str(BENCH / "stub_upstream.py"), "--port", str(port), *extra]


def chatparity_command(server: str, port: int, workers: int = 1) -> list[str]:
    """The ASGI server command line serving the example project.

    ``server`` is ``daphne``, ``uvicorn``, or ``uvicorn-nodelay``: uvicorn with its
    multi-worker TCP_NODELAY bug worked around (``bench/uvicorn_nodelay.py``).
    """
    if server == "daphne":
        return [PYTHON, "-m", "daphne", *f"-b 127.0.0.1 -p {port} -v 0".split(), ASGI_APP]
    uvicorn = (
        [str(BENCH / "uvicorn_nodelay.py")] if server == "uvicorn-nodelay" else ["-m", "uvicorn"]
    )
    options = f"--host 127.0.0.1 --port {port} --workers {workers} --lifespan off"
    return [PYTHON, *uvicorn, ASGI_APP, *options.split(), *UVICORN_QUIET]


def checkout(stack: ExitStack, revision: str, tree: Path) -> Path:
    """``revision`` in a temporary git worktree at ``tree``, removed when ``stack`` closes."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), revision],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    stack.callback(
        subprocess.run, ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False
    )
    return tree


# -- PostgreSQL and Redis ---------------------------------------------------------


@dataclass
class Services:
    """A PostgreSQL database (with pg_stat_statements) and a Redis of the bench's own."""

    database: str
    redis: str
    redis_port: int


@contextmanager
def services(work: Path) -> Iterator[Services]:
    """PostgreSQL and Redis on loopback under ``work`` (as ``.ci/run`` starts them, fsync
    off), stopped after; PostgreSQL counts the statements it runs (pg_stat_statements)."""
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not binaries or not shutil.which("redis-server"):
        sys.exit("PostgreSQL and Redis are needed: apt-get install -y postgresql redis-server")
    # Not under ``work`` (mkdtemp's, which only its owner may enter): the postgres user's.
    data = Path(tempfile.mkdtemp(prefix="chatparity-bench-pg-"))
    as_postgres = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        shutil.chown(data, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    pg_ctl = [*as_postgres, str(binaries[-1] / "pg_ctl"), "-D", str(data / "data")]
    initdb = [*as_postgres, str(binaries[-1] / "initdb"), "-D", str(data / "data")]
    subprocess.run([*initdb, "-A", "trust", "-U", "postgres"], check=True, capture_output=True)
    pg_port, redis_port = free_port(), free_port()
    options = (
        f"-p {pg_port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
        " -c max_connections=300 -c shared_preload_libraries=pg_stat_statements"
        " -c pg_stat_statements.track=top"
    )
    start = [*pg_ctl, "-l", str(data / "log"), "-w", "-o", options, "start"]
    subprocess.run(start, check=True, capture_output=True)
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        server = f"postgres://postgres@127.0.0.1:{pg_port}"
        with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
            connection.execute("CREATE DATABASE chatparity")
        with psycopg.connect(f"{server}/chatparity", autocommit=True) as connection:
            connection.execute("CREATE EXTENSION pg_stat_statements")
        yield Services(f"{server}/chatparity", f"redis://127.0.0.1:{redis_port}/0", redis_port)
    finally:
        redis.terminate()
        redis.wait()
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


@dataclass
class RoundTrips:
    """What the database and Redis did for the requests of one wrk run."""

    requests: int
    statements: int  # SQL statements PostgreSQL ran (BEGIN and COMMIT included)
    transactions: int  # of which COMMIT: the transactions of more than one statement
    rows: int  # of which the log rows' INSERTs: a batch's are one executemany
    redis_commands: int  # commands clients sent Redis (those of its Lua scripts left out)
    redis_scripts: int  # of which EVAL/EVALSHA: a script is one round trip

    def per_request(self, count: int) -> float:
        return count / self.requests if self.requests else 0.0

    @property
    def database_round_trips(self) -> int:
        """The statements, less the log rows but one per batch: psycopg sends the rows of
        an ``executemany`` in one round trip (pipeline mode), and a batch is one
        transaction."""
        return self.statements - self.rows + self.transactions


@contextmanager
def _redis_monitor(port: int) -> Iterator[list[str]]:
    """The commands Redis runs meanwhile, as MONITOR lists them (``... [0 lua] ...`` for
    those of scripts)."""
    lines: list[str] = []
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(b"MONITOR\r\n")
    reader = connection.makefile("rb")
    assert reader.readline() == b"+OK\r\n"

    def read() -> None:
        with contextlib.suppress(OSError, ValueError):  # the socket closed under it
            for line in reader:
                lines.append(line.decode(errors="replace"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield lines
    finally:
        time.sleep(0.2)  # the last lines arrived
        connection.shutdown(socket.SHUT_RDWR)
        thread.join()
        connection.close()


def count_round_trips(
    site: Chatparity, url: str, key: str, *, stream: bool, seconds: int, work: Path
) -> RoundTrips:
    """One request at a time for ``seconds``: the statements and transactions PostgreSQL
    ran and the commands Redis received (through MONITOR) meanwhile, and after it until
    the last rows are written."""
    assert site.services is not None
    common = {"stream": stream, "concurrency": 1, "work": work}
    wrk(url, key, "stub", seconds=1, agent="bench/round-trips/warm-up", **common)  # type: ignore[arg-type]
    time.sleep(1)  # the warm-up's rows written
    with psycopg.connect(site.services.database, autocommit=True) as db:
        db.execute("SELECT pg_stat_statements_reset()")
        with _redis_monitor(site.services.redis_port) as lines:
            summary = wrk(url, key, "stub", seconds=seconds, agent="bench/round-trips", **common)  # type: ignore[arg-type]
            time.sleep(1)  # the last rows written
        sent = [line for line in lines if " lua] " not in line]
        counted = dict(
            db.execute(
                "SELECT CASE WHEN query = 'COMMIT' THEN 'commit'"
                " WHEN query LIKE 'INSERT INTO \"chatparity_requestlog\"%' THEN 'row'"
                " ELSE 'other' END, sum(calls) FROM pg_stat_statements"
                " WHERE query NOT LIKE '%pg_stat_statements%'"
                # The foreign key checks PostgreSQL runs itself for each row inserted.
                " AND query NOT LIKE 'SELECT 1 FROM ONLY %' GROUP BY 1"
            ).fetchall()
        )
    return RoundTrips(
        requests=int(summary["requests"]),
        statements=int(sum(counted.values())),
        transactions=int(counted.get("commit", 0)),
        rows=int(counted.get("row", 0)),
        redis_commands=len(sent),
        redis_scripts=sum(1 for line in sent if '"EVAL' in line.upper()),
    )


# -- the chatparity database ----------------------------------------------------


@dataclass
class Chatparity:
    """A throw-away SQLite database with the bench's backends, aliases and key."""

    database: Path
    env: dict[str, str]
    key: str
    tree: Path = ROOT
    """The source tree served (another revision's checkout: see :func:`make_chatparity`)."""
    services: Services | None = None
    """PostgreSQL and Redis, when the site runs on them (else SQLite, local memory)."""

    def manage(self, *args: str) -> str:
        command = [PYTHON, "manage.py", *args]
        run = subprocess.run(command, cwd=self.tree, env=self.env, check=True, capture_output=True)
        return run.stdout.decode().strip()

    def add_upstream(self, alias: str, base_url: str) -> None:
        """An ``openai`` backend at ``base_url`` and an alias ``alias`` for it."""
        code = (
            "from chatparity.models import Backend, ModelAlias\n"
            f"b = Backend.objects.create(name={alias!r}, kind='openai', base_url={base_url!r},"
            " secret='sk-stub')\n"
            f"ModelAlias.objects.create(public_id={alias!r}, backend=b, model={STUB_MODEL!r})\n"
        )
        self.manage("shell", "--no-imports", "-c", code)

    def request_log(self, user_agent_prefix: str) -> dict[str, int]:
        """What the RequestLog says of the measured requests (warm-ups left out)
        whose User-Agent starts so."""
        query = (
            "SELECT status_code, error_type, cancelled FROM chatparity_requestlog"
            " WHERE user_agent LIKE %s AND user_agent NOT LIKE '%%/warm-up'"
        )
        if self.services is not None:
            with psycopg.connect(self.services.database) as db:
                rows = db.execute(query, (user_agent_prefix + "%",)).fetchall()
        else:
            with closing(sqlite3.connect(self.database, timeout=30)) as db:
                sqlite_query = query.replace("%s", "?").replace("%%", "%")
                rows = db.execute(sqlite_query, (user_agent_prefix + "%",)).fetchall()
        return {
            "rows": len(rows),
            "ok": sum(
                1 for s, error, cancelled in rows if s == 200 and not error and not cancelled
            ),
            "cancelled": sum(1 for *_, cancelled in rows if cancelled),
            "errors": sum(1 for _, error, cancelled in rows if error and not cancelled),
            "5xx": sum(1 for status, *_ in rows if status >= 500),
        }


def make_chatparity(work: Path, tree: Path = ROOT, services: Services | None = None) -> Chatparity:
    """Migrate a fresh database and create the bench's key: a SQLite file under ``work``,
    or on ``services`` (PostgreSQL for the models, Redis for the cache, the limits and the
    channel layer); ``tree``: a checkout of another revision to serve instead of this one
    (its servers run there)."""
    database = work / "chatparity.sqlite3"
    env = {
        **os.environ,
        "DATABASE_URL": services.database if services else f"sqlite:///{database}",
        **({"REDIS_URL": services.redis} if services else {}),
        "DJANGO_ENV": "development",
        "DEBUG": "0",  # DEBUG keeps every query in memory
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(tree),  # ahead of the venv's editable install
    }
    site = Chatparity(database, env, key="", tree=tree, services=services)
    site.manage("migrate", "-v0")
    site.key = site.manage("createapikey", "bench")
    return site


@contextmanager
def serving(site: Chatparity, work: Path, timeout: float) -> Iterator[httpx.Client]:
    """``site`` served by uvicorn (one worker, its log in ``work``), and a client of its
    ``/v1`` with the bench's key."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    headers = {"Authorization": f"Bearer {site.key}"}
    with (
        serve(
            chatparity_command("uvicorn", port),
            f"{url}/models",
            headers,
            env=site.env,
            log_file=work / "uvicorn.log",
        ),
        httpx.Client(base_url=url, headers=headers, timeout=timeout) as client,
    ):
        yield client


# -- wrk ------------------------------------------------------------------------

# Checks every 200 response (all CHUNKS tokens there, a stream ended as its API ends one)
# and prints the totals and exact percentiles as one JSON line.
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"
wrk.headers["User-Agent"] = "%(agent)s"
wrk.body = %(body)s
local stream = %(stream)s
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) bad = 0 end
function response(status, headers, body)
  local _, chunks = string.gsub(body, %(token)s, "")
  if status == 200 and (chunks ~= %(chunks)d or (stream and not (%(ended)s))) then
    bad = bad + 1
  end
end
function done(summary, latency, requests)
  local bad_total = 0
  for _, thread in ipairs(threads) do bad_total = bad_total + thread:get("bad") end
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests":%%d,"seconds":%%f,"p50_us":%%f,"p99_us":%%f,"mean_us":%%f,' ..
    '"connect":%%d,"read":%%d,"write":%%d,"status":%%d,"timeout":%%d,"bad":%%d}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    latency.mean, e.connect, e.read, e.write, e.status, e.timeout, bad_total))
end
"""


@dataclass
class Cell:
    """One wrk run: a target under one workload at one concurrency."""

    target: str
    stream: bool
    concurrency: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    failures: int  # socket errors, time-outs, non-2xx and wrong bodies
    upstream_requests: int = 0  # completions the stub served during the run
    upstream_connections: int = 0  # connections the stub accepted during the run

    @property
    def workload(self) -> str:
        return f"stream ({CHUNKS} chunks)" if self.stream else "non-stream"

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "workload": self.workload}


@dataclass(frozen=True)
class Api:
    """An endpoint wrk loads: its path, a request of it, and how its whole answer of
    CHUNKS tokens (each stub token is "tok ") looks to Lua."""

    path: str
    request: dict[str, object]
    token: str  # found once per token in a whole answer
    stream_token: str  # found once per token in a stream
    stream_ended: str  # a Lua expression on ``body``: the stream ended as it should
    expected: int = CHUNKS  # how often ``token`` is in a whole answer
    streams: bool = True  # whether the endpoint streams


CHAT = Api(
    "chat/completions",
    {"messages": [{"role": "user", "content": "hi"}]},
    "tok ",
    "tok ",
    'string.sub(body, -14) == "data: [DONE]\\n\\n"',
)
# Not stored, as chat completions are not: the same work, in the other encoding. A
# stream repeats the text in its done events: its deltas count the tokens.
RESPONSES = Api(
    "responses",
    {"input": "hi", "store": False},
    "tok ",
    '"delta":"tok ',
    'string.find(body, "event: response.completed\\n", 1, true) ~= nil',
)
# Anthropic's Messages API: the text's deltas count the tokens of a stream.
MESSAGES = Api(
    "messages",
    {"max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]},
    "tok ",
    '"text_delta","text":"tok ',
    'string.find(body, "event: message_stop\\n", 1, true) ~= nil',
)
# One input, one vector of the stub's (1,536 numbers, asked of it in base64, sent as floats).
EMBEDDINGS = Api(
    "embeddings",
    {"input": "hi"},
    '"object":"embedding"',
    "",
    "false",
    expected=1,
    streams=False,
)
# Anthropic's Messages API on the same backend: its text deltas count the tokens.
MESSAGES = Api(
    "messages",
    {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    "tok ",
    '"text":"tok ',
    'string.find(body, "event: message_stop\\n", 1, true) ~= nil',
)


def wrk(
    url: str,
    key: str,
    model: str,
    *,
    stream: bool,
    concurrency: int,
    seconds: int,
    agent: str,
    work: Path,
    api: Api = CHAT,
) -> dict[str, float]:
    """Run wrk against ``url``/``api.path``; its JSON summary."""
    body = {"model": model, **api.request, **({"stream": stream} if api.streams else {})}
    script = work / f"wrk-{os.getpid()}.lua"
    script.write_text(
        WRK_SCRIPT
        % {
            "key": key,
            "agent": agent,
            "body": json.dumps(json.dumps(body)),
            "stream": "true" if stream else "false",
            "chunks": api.expected,
            "token": json.dumps(api.stream_token if stream else api.token),
            "ended": api.stream_ended,
        }
    )
    command = [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds}s",
        "--timeout",
        "30s",
        "-s",
        str(script),
        f"{url}/{api.path}",
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("WRK "))
    summary: dict[str, float] = json.loads(line[4:])
    return summary


def measure(
    target: str,
    url: str,
    key: str,
    model: str,
    *,
    stream: bool,
    concurrency: int,
    seconds: int,
    work: Path,
    stub_stats: str | None = None,
    api: Api = CHAT,
) -> Cell:
    """A 1 s warm-up, then the measured wrk run of one cell (with the stub's
    counters around it when ``stub_stats`` is its stats URL)."""
    agent = f"bench/{target}/{'stream' if stream else 'json'}/c{concurrency}"
    common = {"stream": stream, "concurrency": concurrency, "work": work, "api": api}
    wrk(url, key, model, seconds=1, agent=agent + "/warm-up", **common)  # type: ignore[arg-type]
    before = httpx.get(stub_stats).json() if stub_stats else {}
    summary = wrk(url, key, model, seconds=seconds, agent=agent, **common)  # type: ignore[arg-type]
    after = httpx.get(stub_stats).json() if stub_stats else {}
    cell = cell_of(target, stream, concurrency, summary)
    cell.upstream_requests = after.get("served", 0) - before.get("served", 0)
    cell.upstream_connections = after.get("connections", 0) - before.get("connections", 0)
    return cell


def cell_of(target: str, stream: bool, concurrency: int, summary: dict[str, float]) -> Cell:
    """The Cell of wrk's JSON ``summary``."""
    failures = sum(int(summary[name]) for name in ("connect", "read", "write", "status", "timeout"))
    return Cell(
        target=target,
        stream=stream,
        concurrency=concurrency,
        requests=int(summary["requests"]),
        rps=summary["requests"] / summary["seconds"],
        p50_ms=summary["p50_us"] / 1000,
        p99_ms=summary["p99_us"] / 1000,
        failures=failures + int(summary["bad"]),
    )


# -- RESULTS.md -----------------------------------------------------------------

# Around the section bench/transports.py writes into RESULTS.md, which bench/run.py keeps.
SECTION_START = "<!-- transports: written by bench/transports.py -->"
SECTION_END = "<!-- /transports -->"


def kept_section(path: Path) -> str:
    """bench/transports.py's section as it is in ``path``, or ``""``."""
    current = path.read_text() if path.exists() else ""
    start, end = current.find(SECTION_START), current.find(SECTION_END)
    return current[start : end + len(SECTION_END)] + "\n" if 0 <= start < end else ""


def write_section(path: Path, text: str) -> None:
    """Put bench/transports.py's section ``text`` in place of the one in ``path``, or after
    what is there."""
    current = path.read_text() if path.exists() else ""
    kept = kept_section(path)
    if kept:
        current = current.replace(kept, "")
    path.write_text(current.rstrip("\n") + "\n\n" + text)
