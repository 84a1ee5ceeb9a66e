"""Two revisions of chatparity side by side: the same stub, the same wrk load, alternating rounds.

    .venv/bin/python bench/versions.py BASE [HEAD] [--rounds 5] [--duration 4]

``BASE`` is a git revision (e.g. the commit a change started from); it is checked
out into a temporary worktree and served beside ``HEAD`` (another revision, or
by default the working tree), each by one
uvicorn worker of the example project on a fresh SQLite file, request logging on,
through its ``openai`` backend to one stub upstream. Each round measures both
(in alternating order) and the stub directly; the table gives medians and the
median of the per-round ratios, so the machine's drift between rounds cancels out.
Last, the median ``x-chatparity-overhead-ms`` of each revision that sends it (300
non-stream requests one at a time), to read beside its measured added p50.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from harness import (
    PYTHON,
    ROOT,
    STUB_MODEL,
    UVICORN_QUIET,
    Cell,
    checkout,
    free_port,
    log,
    measure,
    raise_file_limit,
    serve,
    stub_command,
)

WORKLOADS = ((False, 1), (False, 32), (True, 32))  # (stream, concurrency)


def _manage(tree: Path, env: dict[str, str], *args: str) -> str:
    command = [PYTHON, "manage.py", *args]
    return subprocess.run(
        command, cwd=tree, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@contextmanager
def _site(
    tree: Path, work: Path, upstream: str, extra_env: dict[str, str]
) -> Iterator[tuple[str, str]]:
    """Serve ``tree``'s example project, with ``extra_env``; yield its /v1 URL and key."""
    env = {
        **os.environ,
        **extra_env,
        "PYTHONPATH": str(tree),  # ahead of the venv's editable install
        "DATABASE_URL": f"sqlite:///{work / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DJANGO_ENV": "development",
        "DEBUG": "0",
    }
    _manage(tree, env, "migrate", "-v0")
    key = _manage(tree, env, "createapikey", "bench")
    code = (
        "from chatparity.models import Backend, ModelAlias\n"
        f"b = Backend.objects.create(name='stub', kind='openai', base_url={upstream!r})\n"
        f"ModelAlias.objects.create(public_id='stub', backend=b, model={STUB_MODEL!r})\n"
    )
    _manage(tree, env, "shell", "--no-imports", "-c", code)
    port = free_port()
    command = [PYTHON, "-m", "uvicorn", "project.asgi:application", "--port", str(port)]
    command += ["--lifespan", "off", *UVICORN_QUIET]
    url = f"http://127.0.0.1:{port}/v1"
    headers = {"Authorization": f"Bearer {key}"}
    with serve(command, f"{url}/models", headers, env=env, cwd=tree, log_file=work / "log"):
        yield url, key


def _median_ratio(pairs: list[tuple[float, float]]) -> float:
    return statistics.median(new / old for old, new in pairs)


def _added_p50(cells: list[Cell], direct: list[Cell]) -> float:
    """Median over rounds of p50 through the gateway minus p50 of the stub alone."""
    return statistics.median(c.p50_ms - d.p50_ms for c, d in zip(cells, direct, strict=True))


OVERHEAD_HEADER = "x-chatparity-overhead-ms"


def _overhead_header_p50(url: str, key: str, requests: int = 300) -> float | None:
    """The median of ``x-chatparity-overhead-ms`` over ``requests`` non-stream requests one
    at a time (None: a revision without the header)."""
    body = {"model": "stub", "messages": [{"role": "user", "content": "Hi"}]}
    headers = {"Authorization": f"Bearer {key}"}
    values = []
    with httpx.Client(headers=headers) as client:
        for _ in range(requests):
            value = client.post(f"{url}/chat/completions", json=body).headers.get(OVERHEAD_HEADER)
            if value is None:
                return None
            values.append(float(value))
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", help="the git revision to compare with")
    parser.add_argument("head", nargs="?", help="a second revision; default: the working tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=4, help="measured seconds per cell")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="SIDE:NAME=VALUE",
        help="an environment variable for one side's server (base or head), e.g."
        " base:CHATPARITY_METRICS_NETWORKS= to serve the same revision without metrics",
    )
    args = parser.parse_args()
    raise_file_limit()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cp-versions-")))
        base_tree = checkout(stack, args.base, work / "base-tree")
        head_tree = checkout(stack, args.head, work / "head-tree") if args.head else ROOT
        stub_port = free_port()
        stub = f"http://127.0.0.1:{stub_port}/v1"
        stack.enter_context(
            serve(stub_command(stub_port), f"http://127.0.0.1:{stub_port}/bench/stats")
        )
        extra_env: dict[str, dict[str, str]] = {"base": {}, "head": {}}
        for setting in args.env:
            side, _, assignment = setting.partition(":")
            name, _, value = assignment.partition("=")
            extra_env[side][name] = value
        sites = {}
        for label, tree in (("base", base_tree), ("head", head_tree)):
            (work / label).mkdir()
            sites[label] = stack.enter_context(_site(tree, work / label, stub, extra_env[label]))
        cells: dict[tuple[str, bool, int], list[Cell]] = {}
        for round_number in range(args.rounds):
            order = ["base", "head"] if round_number % 2 == 0 else ["head", "base"]
            log(f"round {round_number + 1}/{args.rounds}: {' then '.join(order)}")
            for stream, concurrency in WORKLOADS:
                targets = [("direct", stub, "stub-key")] if concurrency == 1 else []
                targets += [(label, *sites[label]) for label in order]
                for label, url, key in targets:
                    cell = measure(
                        label, url, key, "stub", stream=stream, concurrency=concurrency,
                        seconds=args.duration, work=work,
                    )  # fmt: skip
                    cells.setdefault((label, stream, concurrency), []).append(cell)
        header_p50 = {label: _overhead_header_p50(*sites[label]) for label in sites}
        head = args.head or "the working tree"
        print(f"\n{args.base} (base) vs {head} (head), {args.rounds} rounds\n")
        print("| workload | conc. | base req/s | head req/s | head/base | base added p50 ms"
              " | head added p50 ms | failures |")  # fmt: skip
        print("|---|--:|--:|--:|--:|--:|--:|--:|")
        for stream, concurrency in WORKLOADS:
            base, head = cells[("base", stream, concurrency)], cells[("head", stream, concurrency)]
            ratio = _median_ratio([(b.rps, h.rps) for b, h in zip(base, head, strict=True)])
            added = ["", ""]
            if concurrency == 1:
                direct = cells[("direct", stream, concurrency)]
                added = [f"{_added_p50(side, direct):+.2f}" for side in (base, head)]
            failures = sum(c.failures for c in base + head)
            workload = "stream" if stream else "non-stream"
            print(
                f"| {workload} | {concurrency} | {statistics.median(c.rps for c in base):,.0f}"
                f" | {statistics.median(c.rps for c in head):,.0f} | {ratio:.3f}x"
                f" | {added[0]} | {added[1]} | {failures} |"
            )
        for label, p50 in header_p50.items():
            if p50 is not None:  # beside the added p50 above: what the gateway says it took
                print(f"\n{label}: {OVERHEAD_HEADER} p50 {p50:.2f} ms (non-stream, one at a time)")


if __name__ == "__main__":
    main()
