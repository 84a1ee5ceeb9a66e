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
  for each upstream call made, the prompt the upstream announced for it, else the
  prompt reserved; and the completion tokens counted as they arrived. A backend that
  notes no calls (the local model, a program) counts one once it began answering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..protocol.events import Usage


def settled_usage(
    reserved_prompt: int,
    calls: Sequence[int | None],
    reported: Usage | None,
    completion_sent: int,
    *,
    answered: bool,
) -> Usage:
    """The usage a request is charged and logged with.

    ``reserved_prompt``: the prompt its admission counted for one upstream call;
    ``calls``: the prompt the upstream announced for each call made (None: not said);
    ``reported``: the usage the backend yielded, if it did; ``completion_sent``: the
    completion tokens counted from the events that arrived; ``answered``: whether the
    backend began answering (a backend that notes no calls made one then)."""
    if reported is not None and not reported.counted:
        return reported
    if not calls and answered:
        calls = (None,)
    prompt = sum(reserved_prompt if announced is None else announced for announced in calls)
    if reported is not None:  # counted by the backend: never below what was sent
        return dataclasses.replace(reported, prompt_tokens=max(prompt, reported.prompt_tokens))
    return Usage(prompt, completion_sent, counted=True)
