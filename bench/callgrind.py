"""Instructions per request on the hot path, counted by valgrind's callgrind: a figure
that does not move with the machine's load.

    .venv/bin/python bench/callgrind.py [--requests 100] [--base REVISION] [--keep DIR]

For each workload (one non-stream request at a time, one stream of 20 chunks at a
time) a process runs under ``valgrind --tool=callgrind --instr-atstart=no``: it
calls the example project's ASGI application in process, as ``bench/anatomy.py``
does (the fast path, an ``openai`` backend on the stub, which runs outside valgrind,
request logging on, SQLite in a temporary file), warms up, then switches callgrind's
instrumentation on (``callgrind_control``), serves ``--requests`` requests, lets the
log writer write their rows, and dumps. Instructions per request = the dump's total
/ requests: the gateway's whole cost, its log rows and the thread hops included.
With ``--base``, the same for another revision (a checkout of its own). ``--keep``
keeps the dumps, for ``callgrind_annotate``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import anatomy
import harness
from harness import log

WORKLOADS = (("non-stream", False), ("stream", True))
WARM_UP = 30


def control(*args: str) -> None:
    """Run callgrind_control on this process; it answers only while the process runs
    (valgrind reads its commands between basic blocks), so never block on it."""
    process = subprocess.Popen(
        ["callgrind_control", *args, str(os.getpid())], stdout=subprocess.DEVNULL
    )
    while process.poll() is None:
        time.sleep(0.01)
    if process.returncode:
        raise RuntimeError(f"callgrind_control {' '.join(args)} failed")


async def served(stream: bool, requests: int, key: str) -> None:
    """Warm up, then ``requests`` counted requests one at a time, and their rows written."""
    from project.asgi import application

    for _ in range(WARM_UP):
        await anatomy.call(application, key, stream)
    await asyncio.sleep(1)  # the warm-up's rows written
    control("--instr=on")
    control("--zero")
    for _ in range(requests):
        status, _ = await anatomy.call(application, key, stream)
        if status != 200:
            raise RuntimeError(f"a request failed ({status})")
    await asyncio.sleep(1)  # their rows written, in batches after the replies
    control("--dump=measured")
    control("--instr=off")


def child(tree: Path, stream: bool, requests: int) -> None:
    """The process under valgrind: one workload of ``requests`` requests."""
    site, stub_port, stub_url = anatomy.in_process_site("chatparity-callgrind-", tree)
    loop_factory, _ = anatomy.event_loop()
    with harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"):
        import django

        django.setup()
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(served(stream, requests, site.key))


def total(dump: Path) -> int:
    """The instructions a callgrind dump counted."""
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def count(tree: Path, stream: bool, requests: int, out: Path) -> float:
    """Instructions per request of one workload served from ``tree``."""
    out.mkdir(parents=True, exist_ok=True)
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/callgrind.out",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(tree),
        "--stream" if stream else "--no-stream",
        "--requests",
        str(requests),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    [dump] = [path for path in out.iterdir() if path.name != "callgrind.out"]
    return total(dump) / requests


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100, help="counted, per workload")
    parser.add_argument("--base", metavar="REVISION", help="a revision to count beside this one")
    parser.add_argument("--keep", type=Path, help="keep the dumps here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=False)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.stream, args.requests)
        return
    if not shutil.which("valgrind"):
        sys.exit("The count needs valgrind: sudo apt-get install -y valgrind.")
    work = Path(tempfile.mkdtemp(prefix="chatparity-callgrind-"))
    keep = args.keep or work
    with ExitStack() as stack:
        trees = {"HEAD": harness.ROOT}
        if args.base:
            trees[args.base] = harness.checkout(stack, args.base, work / "base")
        print("| revision | " + " | ".join(name for name, _ in WORKLOADS) + " |")
        print("|---|" + "---:|" * len(WORKLOADS))
        for label, tree in trees.items():
            counts = []
            for name, stream in WORKLOADS:
                out = keep / f"{label}-{name}"
                per_request = count(tree, stream, args.requests, out)
                log(f"  {label} {name}: {per_request / 1e6:.2f} M instructions per request")
                counts.append(f"{per_request / 1e6:.2f} M")
            print(f"| {label} | " + " | ".join(counts) + " |")


if __name__ == "__main__":
    main()
