"""The local model's prompt cache: time to first token of an agent session's turns.

    python bench/prefix_cache.py [--rounds 3] [--prefix-tokens 3000]

Through ``POST /v1/chat/completions`` on uvicorn (the example project, the key, the
limits and the log row), SmolLM2-135M on a ``local`` backend with ``n_ctx`` 4096 (the
default 2048 cannot hold a 3,000-token prefix and an answer), other options default:

1. One session: a system prompt of about 3,000 tokens (made-up source code, as an
   agent's context is), a first turn, then a second turn that appends the answer and a
   short question. Each turn's time to first token (the request sent to the first
   content delta), prompt and cached tokens as its usage says.
2. Sessions interleaved, A, B, A, B, each with a prefix of its own: with the prompt
   cache, and on a backend with ``prompt_cache_bytes: 0`` (each context reuses only
   what it holds: the turns of the other session push it out).

Both sampled (temperature 1, as agents ask: the whole shared prefix is reused) and greedy
(temperature 0: reproducible requests reuse whole 64-token blocks only). Each round
has prefixes of its own; the table gives the median of the rounds. Prints a table, and
the load average before and after: the machine may be shared, the ratios are what counts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from harness import ROOT, log, make_chatparity, serving

TARGET = 0.25  # the second turn's time to first token, at most this share of the first's
N_CTX = 4096
BACKENDS = {  # alias: the local backend's options
    "smollm2-4k": {"n_ctx": N_CTX},
    "smollm2-4k-uncached": {"n_ctx": N_CTX, "prompt_cache_bytes": 0},
}
_sessions = itertools.count()


@dataclass
class Turn:
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    answer: str


def prefix(tokens: int, count_tokens: Callable[[str], int]) -> str:
    """A made-up source file of about ``tokens`` tokens, different for each session."""
    session = next(_sessions)
    lines: list[str] = [f"# Session {session}: the project's helpers, as the agent read them."]
    while True:
        number = len(lines)
        lines.append(
            f"def helper_{session}_{number}(value: int) -> int:\n"
            f'    """Scale value by {number} and add {number % 7}."""\n'
            f"    return value * {number} + {number % 7}\n"
        )
        if number % 10 == 0 and count_tokens("\n".join(lines)) >= tokens:
            return "\n".join(lines)


def ask(
    client: httpx.Client, alias: str, messages: list[dict[str, str]], temperature: float
) -> Turn:
    """One streamed turn: its time to first token and its usage."""
    body = {
        "model": alias,
        "messages": messages,
        "max_tokens": 24,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = 0.0
    answer = ""
    usage: dict[str, Any] = {}
    with client.stream("POST", "/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{alias} failed: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter()
                answer += chunk["choices"][0]["delta"]["content"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return Turn((first - started) * 1000, usage["prompt_tokens"], cached, answer)


def first_turn(system: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "What does helper number 12 return for 3?"},
    ]


def next_turn(messages: list[dict[str, str]], turn: Turn) -> list[dict[str, str]]:
    return [
        *messages,
        {"role": "assistant", "content": turn.answer},
        {"role": "user", "content": "And for 4?"},
    ]


def one_session(client: httpx.Client, system: str, temperature: float) -> list[Turn]:
    messages = first_turn(system)
    first = ask(client, "smollm2-4k", messages, temperature)
    return [first, ask(client, "smollm2-4k", next_turn(messages, first), temperature)]


def interleaved(
    client: httpx.Client, alias: str, systems: tuple[str, str], temperature: float
) -> list[Turn]:
    """A1, B1, A2, B2."""
    asked = [first_turn(system) for system in systems]
    firsts = [ask(client, alias, messages, temperature) for messages in asked]
    seconds = [
        ask(client, alias, next_turn(messages, turn), temperature)
        for messages, turn in zip(asked, firsts, strict=True)
    ]
    return [firsts[0], firsts[1], seconds[0], seconds[1]]


def token_counter() -> Callable[[str], int]:
    from llama_cpp import Llama

    sys.path.insert(0, str(ROOT))
    from chatparity.backends.local import smollm2_model_path

    vocab = Llama(smollm2_model_path(), vocab_only=True, verbose=False)
    return lambda text: len(vocab.tokenize(text.encode(), add_bos=False, special=False))


def measure(
    client: httpx.Client, rounds: int, prefix_tokens: int
) -> dict[tuple[str, str], list[Turn]]:
    """(scenario, turn) -> that turn in each round."""
    count_tokens = token_counter()
    runs: dict[tuple[str, str], list[Turn]] = {}
    for alias in BACKENDS:  # loads the model and a context
        ask(client, alias, [{"role": "user", "content": "Hi"}], 0)
    for round in range(rounds):
        for temperature, sampling in ((1.0, "sampled"), (0.0, "greedy")):
            log(f"round {round + 1}, {sampling}: one session")
            turns = one_session(client, prefix(prefix_tokens, count_tokens), temperature)
            for name, turn in zip(("turn 1", "turn 2"), turns, strict=True):
                runs.setdefault((f"one session, {sampling}", name), []).append(turn)
            for alias, cache in zip(BACKENDS, ("cache", "no cache"), strict=True):
                log(f"round {round + 1}, {sampling}: interleaved, {cache}")
                systems = (
                    prefix(prefix_tokens, count_tokens),
                    prefix(prefix_tokens, count_tokens),
                )
                turns = interleaved(client, alias, systems, temperature)
                for name, turn in zip(("A1", "B1", "A2", "B2"), turns, strict=True):
                    runs.setdefault((f"interleaved, {sampling}, {cache}", name), []).append(turn)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefix-tokens", type=int, default=3000)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        site = make_chatparity(Path(folder))
        code = "from chatparity.models import Backend, ModelAlias\n" + "".join(
            f"b = Backend.objects.create(name={alias!r}, kind='local', options={options!r})\n"
            f"ModelAlias.objects.create(public_id={alias!r}, backend=b, model='SmolLM2')\n"
            for alias, options in BACKENDS.items()
        )
        site.manage("shell", "--no-imports", "-c", code)
        # A cold 3,000-token prompt may take over a minute on a busy machine: more than
        # FIRST_BYTE_TIMEOUT gives a backend to start answering.
        settings = Path(folder) / "bench_settings.py"
        settings.write_text(
            "from project.settings import *  # noqa: F403\n"
            "CHATPARITY = {**CHATPARITY, 'FIRST_BYTE_TIMEOUT': 900.0}  # noqa: F405\n"
        )
        site.env = {
            **site.env,
            "DJANGO_SETTINGS_MODULE": "bench_settings",
            "PYTHONPATH": f"{site.env['PYTHONPATH']}{os.pathsep}{folder}",
        }
        with serving(site, Path(folder), timeout=900) as client:
            runs = measure(client, args.rounds, args.prefix_tokens)
    report(runs, load_before, os.getloadavg(), args.rounds)


FIRST_OF = {"turn 2": "turn 1", "A2": "A1", "B2": "B1"}  # a later turn: its session's first


def report(
    runs: dict[tuple[str, str], list[Turn]],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    rounds: int,
) -> None:
    """The table: the median of the rounds for each turn of each scenario."""

    def ttft(scenario: str, name: str) -> float:
        return statistics.median(turn.ttft_ms for turn in runs[scenario, name])

    header = ("scenario", "turn", "prompt tok", "cached tok", "TTFT ms", "of its turn 1")
    rows = [
        (
            scenario,
            name,
            f"{statistics.median(turn.prompt_tokens for turn in turns):.0f}",
            f"{statistics.median(turn.cached_tokens for turn in turns):.0f}",
            f"{ttft(scenario, name):,.0f}",
            f"{ttft(scenario, name) / ttft(scenario, FIRST_OF[name]):.1%}"
            if name in FIRST_OF
            else "",
        )
        for (scenario, name), turns in runs.items()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print()
    for row in [header, tuple("-" * width for width in widths), *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    ratio = ttft("one session, sampled", "turn 2") / ttft("one session, sampled", "turn 1")
    print(
        f"\nsampled session: turn 2's time to first token is {ratio:.1%} of turn 1's (target"
        f" at most {TARGET:.0%}: {'met' if ratio <= TARGET else 'NOT met'});"
        f" median of {rounds} round(s)"
    )
    print(
        f"({os.cpu_count()} cores; load average {load_before[0]:.2f} at the start,"
        f" {load_after[0]:.2f} at the end)"
    )


if __name__ == "__main__":
    main()
