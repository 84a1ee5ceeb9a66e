"""Waiting for a condition instead of for a guessed time."""

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:  # noqa: ASYNC109
    """Return once ``condition()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {condition}")
        await asyncio.sleep(0.002)
