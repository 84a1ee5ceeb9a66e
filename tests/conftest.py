import os
import shutil
import socket
import subprocess
import time
from contextlib import closing

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", help="Rewrite golden transcripts from the code."
    )


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """``REDIS_URL`` when set (CI's second run), else a redis-server of our own."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = shutil.which("redis-server")
    assert server, "redis-server is needed (apt install redis-server; .ci/run installs it)"
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tmp_path_factory.mktemp("redis")
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder]
    process = subprocess.Popen([str(part) for part in command], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        with closing(socket.socket()) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield url
    process.terminate()
    process.wait(timeout=10)
