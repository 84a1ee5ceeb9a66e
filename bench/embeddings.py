"""Embeddings: the embedded model's inputs/s, and what the gateway adds to an upstream's.

1. The embedded model (all-MiniLM-L6-v2, int8 ONNX on ONNX Runtime) in inputs per
   second, at batch 1 (requests of one input, one after the other) and batch 256
   (requests of 256 inputs): in process (the ``embedder`` backend called directly)
   and through ``POST /v1/embeddings`` on uvicorn, with the key, the limits and the
   log row.
2. An upstream's embeddings (``bench/stub_upstream.py``: 1,536 numbers a vector,
   base64) asked directly and through chatparity (an ``openai`` alias), one request
   at a time, the two alternating: the latency percentiles side by side, and the
   difference, which is what the gateway adds (reading, checking and re-encoding
   the vectors included).

    python bench/embeddings.py [--requests 200]

Prints a table. Sentences are made up of a dozen words, as a search query or a
short passage is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from harness import ROOT, free_port, log, make_chatparity, serve, serving, stub_command

WORDS = [
    *[
        "the",
        "a",
        "search",
        "index",
        "query",
        "document",
        "model",
        "vector",
        "river",
        "bank",
        "money",
        "cat",
        "dog",
    ],
    *[
        "garden",
        "train",
        "station",
        "invoice",
        "budget",
        "weather",
        "sunny",
        "rain",
        "tomorrow",
        "server",
    ],
    *[
        "request",
        "key",
        "limit",
        "answer",
        "question",
        "reader",
        "library",
        "city",
        "museum",
        "market",
        "price",
    ],
]


def sentences(count: int, seed: int = 0) -> list[str]:
    chance = random.Random(seed)
    return [" ".join(chance.choice(WORDS) for _ in range(12)) for _ in range(count)]


def inputs_per_second(embed: Callable[[list[str]], object], batch: int, total: int) -> float:
    """Inputs/s of ``embed`` called on batches of ``batch`` sentences, ``total`` inputs."""
    texts = sentences(total)
    embed(texts[:batch])  # warm
    started = time.perf_counter()
    for start in range(0, total, batch):
        embed(texts[start : start + batch])
    return total / (time.perf_counter() - started)


def in_process(batch: int, total: int) -> float:
    """The ``embedder`` backend called in this process, on its own event loop."""
    import django

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from chatparity.backends.base import BackendConfig
    from chatparity.backends.embedder import EmbedderBackend
    from chatparity.protocol.embeddings import EmbeddingsRequest

    backend = EmbedderBackend(BackendConfig(name="bench", kind="embedder"))
    loop = asyncio.new_event_loop()

    def embed(texts: list[str]) -> object:
        request = EmbeddingsRequest(model="embed-small", inputs=tuple(texts), body={})
        return loop.run_until_complete(backend.embed(request, "all-MiniLM-L6-v2"))

    try:
        return inputs_per_second(embed, batch, total)
    finally:
        loop.close()


def over_http(client: httpx.Client, model: str) -> Callable[[list[str]], object]:
    def embed(texts: list[str]) -> object:
        answer = client.post("/embeddings", json={"model": model, "input": texts})
        answer.raise_for_status()
        return answer.json()

    return embed


def latencies(
    direct: httpx.Client, gateway: httpx.Client, requests: int
) -> tuple[list[float], list[float], list[float]]:
    """Milliseconds of ``requests`` embeddings of one sentence asked directly and as many
    through chatparity, alternately (so both see the same load), as openai-python asks
    (base64); and the gateway's own milliseconds of each (its overhead header)."""
    sides = ((direct, "stub-model"), (gateway, "stub-embed"))
    text = sentences(1)[0]
    times: tuple[list[float], list[float]] = ([], [])
    overhead: list[float] = []
    for round in range(requests + 20):  # the first 20 warm
        for (client, model), spent in zip(sides, times, strict=True):
            body = {"model": model, "input": text, "encoding_format": "base64"}
            started = time.perf_counter()
            answer = client.post("/embeddings", json=body)
            answer.raise_for_status()
            if round >= 20:
                spent.append((time.perf_counter() - started) * 1000)
                if client is gateway:
                    overhead.append(float(answer.headers["x-chatparity-overhead-ms"]))
    return *times, overhead


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="latency requests per side")
    parser.add_argument("--inputs", type=int, default=1024, help="inputs per throughput run")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows: list[tuple[str, str]] = []
    log("embedded model, in process")
    for batch, total in ((1, 200), (256, args.inputs)):
        rate = in_process(batch, total)
        rows.append((f"embedded model in process, batch {batch}", f"{rate:,.0f} inputs/s"))
    with tempfile.TemporaryDirectory() as folder:
        site = make_chatparity(Path(folder))
        site.manage("chatparity_bootstrap")
        stub_port = free_port()
        stub_url = f"http://127.0.0.1:{stub_port}/v1"
        site.add_upstream("stub-embed", stub_url)
        with (
            serve(stub_command(stub_port), f"{stub_url}/models"),
            serving(site, Path(folder), timeout=300) as gateway,
            httpx.Client(base_url=stub_url, timeout=300) as direct,
        ):
            log("embedded model through /v1/embeddings")
            for batch, total in ((1, 200), (256, args.inputs)):
                rate = inputs_per_second(over_http(gateway, "embed-small"), batch, total)
                rows.append(
                    (f"embedded model via /v1/embeddings, batch {batch}", f"{rate:,.0f} inputs/s")
                )
            log("an upstream's embeddings, direct and through chatparity")
            plain, through, own = latencies(direct, gateway, args.requests)
    for name, values in (("upstream direct", plain), ("upstream via chatparity", through)):
        rows.append(
            (
                f"{name}, 1 input x 1,536 dims",
                f"p50 {percentile(values, 0.5):.2f} ms, p99 {percentile(values, 0.99):.2f} ms",
            )
        )
    added = statistics.median(through) - statistics.median(plain)
    rows.append(("added by chatparity (p50)", f"{added:.2f} ms"))
    rows.append(
        (
            "of which its own time (overhead header)",
            f"p50 {percentile(own, 0.5):.2f} ms, p99 {percentile(own, 0.99):.2f} ms",
        )
    )
    width = max(len(name) for name, _ in rows)
    print(f"\n{'measure'.ljust(width)}  result")
    print(f"{'-' * width}  {'-' * 36}")
    for name, result in rows:
        print(f"{name.ljust(width)}  {result}")
    print(f"\n({os.cpu_count()} cores, load average {load:.1f} at the start)")


if __name__ == "__main__":
    main()
