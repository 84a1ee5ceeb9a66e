"""chatparity's chunks against streams recorded from the real API (``recorded/``): the
same events give the same chunks, byte for byte in JSON, field order included.

Unlike the golden transcripts these are never regenerated from the code."""

from pathlib import Path

import orjson

from chatparity.protocol.events import Finish, TextDelta, Usage
from chatparity.protocol.stream import ChunkEncoder

RECORDED = Path(__file__).parent / "recorded"


def recorded(name):
    return [line for line in (RECORDED / name).read_bytes().splitlines() if line]


def test_a_text_answer_with_usage_is_chunked_as_openai_does():
    lines = recorded("chat_text_with_usage.jsonl")
    first = orjson.loads(lines[0])
    encoder = ChunkEncoder(
        completion_id=first["id"],
        created=first["created"],
        model=first["model"],
        system_fingerprint=first["system_fingerprint"],
        include_usage=True,
    )
    events = [
        TextDelta(0, "**"),
        TextDelta(0, "Hello"),
        TextDelta(0, " there"),
        Finish(0, "stop"),
        Usage(prompt_tokens=16, completion_tokens=3),
    ]
    produced = [orjson.dumps(chunk) for event in events for chunk in encoder.encode(event)]
    assert produced == lines
