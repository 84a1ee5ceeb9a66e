"""The one rule a request's usage is settled by: its limits, its log row and the row of a
request whose worker was killed all read it from here.

A request is charged at least what was sent upstream on its behalf, and reserved at
least what it can be charged. Its admission reserved a prompt per upstream call it
may make (the backend's own count where it has a tokenizer, else the bound no
tokenizer passes: :func:`chatparity.protocol.tokens.prompt_bound`), once per choice.
When it ends:

- the backend reported the usage (an upstream's, believed; the local model's): that
  usage, which the upstream bills;
- else (the client left, the upstream failed midway or reported nothing believable):
  for each upstream call made, the prompt the upstream announced for it with the cache
  reads and writes it announced, else the prompt reserved (uncached); and the
  completion tokens counted as they arrived. A backend that notes no calls (the local
  model, a program) counts one once it began answering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..protocol.events import Usage


def settled_usage(
    reserved_prompt: int,
    calls: Sequence[Usage | None],
    reported: Usage | None,
    completion_sent: int,
    *,
    answered: bool,
) -> Usage:
    """The usage a request is charged and logged with.

    ``reserved_prompt``: the prompt its admission counted for one upstream call;
    ``calls``: the usage the upstream announced for each call made (None: not said), of
    which the prompt and its cache reads and writes count; ``reported``: the usage the
    backend yielded, if it did; ``completion_sent``: the completion tokens counted from
    the events that arrived; ``answered``: whether the backend began answering (a backend
    that notes no calls made one then)."""
    if reported is not None and not reported.counted:
        return reported
    if not calls and answered:
        calls = (None,)
    sent = [Usage(reserved_prompt, 0) if call is None else call for call in calls]
    prompt = Usage(
        sum(call.prompt_tokens for call in sent),
        completion_sent,
        cached_tokens=sum(call.cached_tokens for call in sent),
        cache_write_5m_tokens=sum(call.cache_write_5m_tokens for call in sent),
        cache_write_1h_tokens=sum(call.cache_write_1h_tokens for call in sent),
        counted=True,
    )
    if reported is None:
        return prompt
    # Counted by the backend: never below what was sent, the cache as it was announced.
    return dataclasses.replace(
        prompt,
        prompt_tokens=max(prompt.prompt_tokens, reported.prompt_tokens),
        completion_tokens=reported.completion_tokens,
        reasoning_tokens=reported.reasoning_tokens,
    )
