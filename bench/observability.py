"""What the metrics and the traces cost a request: in one process, alternating rounds.

    .venv/bin/python bench/observability.py [--rounds 7] [--requests 2000]

Calls the example project's ASGI application directly (as ``bench/anatomy.py``:
no HTTP server, uvloop when installed, the ``openai`` backend on the fast stub,
request logging on, SQLite in a temporary file), 32 requests at a time, in
rounds that alternate what observes the requests: nobody (neither
``chatparity.metrics`` nor ``chatparity.tracing`` installed), the metrics, and the
metrics with the traces (OpenTelemetry's SDK, spans sampled and dropped by a
processor that exports nothing). Machine drift between rounds cancels out in the
median of each round's ratio to the round without observers. Prints CPU time
per request and that ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import harness
from anatomy import call, event_loop, in_process_site

CONCURRENCY = 32


async def _round(key: str, requests: int, stream: bool) -> float:
    """CPU seconds per request over ``requests`` calls, ``CONCURRENCY`` at a time."""
    from project.asgi import application

    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            status, _ = await call(application, key, stream)
            if status != 200:
                raise RuntimeError(f"a request failed ({status})")

    cpu = time.process_time()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    return (time.process_time() - cpu) / requests


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=2000, help="per round and mode")
    args = parser.parse_args()
    site, stub_port, stub_url = in_process_site("chatparity-observability-")
    loop_factory, _ = event_loop()
    with harness.serve(harness.stub_command(stub_port), f"{stub_url}/models"):
        import django

        django.setup()
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

        from chatparity import signals
        from chatparity.metrics.instruments import Metrics
        from chatparity.tracing import spans
        from chatparity.tracing.spans import Tracing

        class Dropped(SpanExporter):
            def export(self, spans: object) -> object:  # type: ignore[override]
                return None

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Dropped()))
        spans.tracer = provider.get_tracer("bench")
        modes = {"none": (), "metrics": (Metrics(),), "metrics+traces": (Metrics(), Tracing())}
        for stream in (False, True):
            cpu: dict[str, list[float]] = {mode: [] for mode in modes}
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                signals.observers = ()
                runner.run(_round(site.key, 200, stream))  # warm-up
                for number in range(args.rounds):
                    order = list(modes) if number % 2 == 0 else list(reversed(modes))
                    for mode in order:
                        signals.observers = modes[mode]
                        cpu[mode].append(runner.run(_round(site.key, args.requests, stream)))
            signals.observers = ()
            workload = "stream" if stream else "non-stream"
            print(f"\n{workload}, {CONCURRENCY} at a time, {args.rounds} rounds\n")
            print("| observers | CPU us/request | vs none |")
            print("|---|--:|--:|")
            for mode, seconds in cpu.items():
                ratio = statistics.median(
                    mine / base for mine, base in zip(seconds, cpu["none"], strict=True)
                )
                print(f"| {mode} | {statistics.median(seconds) * 1e6:.0f} | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
