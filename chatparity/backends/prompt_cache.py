"""The embedded model's prompt cache: the evaluated state (llama.cpp's KV cells) of recent
prompts, kept within a budget of bytes, so that a prompt which starts as an earlier one
did evaluates only what follows.

States are kept per caller, as OpenAI and Anthropic keep caches per organization: a key
never learns from its cached tokens, or from how fast it is answered, what another key
sent.

Reproducible requests (greedy or seeded) reuse only what evaluating their prompt from
nothing would compute, bit for bit: prompts are evaluated in batches of
:data:`BLOCK_TOKENS` counted from their first token, so the cells before a multiple of
it were computed from the same tokens in the same batches, whatever came after. Cells
evaluated otherwise (generated one token at a time, or after a prefix reused at another
boundary) serve the other requests only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

    import numpy as np
    from numpy.typing import NDArray

    Tokens = NDArray[np.intc]

BLOCK_TOKENS = 64
"""llama.cpp's micro-batch (``n_ubatch``): prompts are evaluated in batches of this many
tokens, counted from the prompt's first."""


def common_prefix(first: Tokens, second: Tokens) -> int:
    """How many leading tokens ``first`` and ``second`` share."""
    import numpy as np  # like llama_cpp, which brings it: only [local] installs it

    limit = min(len(first), len(second))
    same = np.asarray(first[:limit]) == np.asarray(second[:limit])
    return limit if same.all() else int(np.argmin(same))


def reusable(common: int, exact: int, length: int, *, reproducible: bool) -> int:
    """How many leading tokens of a prompt of ``length`` tokens may be taken from cells
    that hold its first ``common``, the first ``exact`` of them as evaluating from
    nothing computes them: never the last (its logits are sampled from), and for a
    reproducible request only up to a batch boundary within ``exact``."""
    most = min(common, length - 1)
    if reproducible:
        most = min(most, exact) // BLOCK_TOKENS * BLOCK_TOKENS
    return max(most, 0)


def exact_after(start: int, exact: int, length: int) -> int:
    """The cells of a prompt of ``length`` tokens evaluated from ``start`` as evaluating
    from nothing computes them, when the first ``exact`` were."""
    if start % BLOCK_TOKENS == 0 and exact >= start:
        return length // BLOCK_TOKENS * BLOCK_TOKENS
    return min(exact, start) // BLOCK_TOKENS * BLOCK_TOKENS


@dataclass(frozen=True, eq=False)
class SavedPrompt:
    """The cells of one context's sequence, as ``llama_state_seq_get_data`` wrote them."""

    owner: str
    tokens: Tokens
    """The tokens the cells hold, in order."""
    exact: int
    """The leading cells computed as evaluating ``tokens`` from nothing computes them."""
    state: ctypes.Array[ctypes.c_uint8]

    @property
    def size(self) -> int:
        """The bytes it keeps in memory."""
        return len(self.state) + self.tokens.nbytes


class PromptCache:
    """Saved prompts within ``budget`` bytes in all, the least recently used dropped
    first; a budget of 0 keeps none."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._saved: OrderedDict[SavedPrompt, None] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        """The bytes the saved prompts keep."""
        return self._size

    def saved(self) -> list[SavedPrompt]:
        """The saved prompts, least recently used first."""
        with self._lock:
            return list(self._saved)

    def find(
        self, owner: str, tokens: Tokens, *, reproducible: bool
    ) -> tuple[SavedPrompt, int] | None:
        """The saved prompt of ``owner`` that serves most of ``tokens`` and how many it
        serves (none serves any: None); the one found counts as used."""
        with self._lock:
            best, served = None, 0
            for saved in self._saved:
                if saved.owner != owner:
                    continue
                common = common_prefix(saved.tokens, tokens)
                length = reusable(common, saved.exact, len(tokens), reproducible=reproducible)
                if length > served:
                    best, served = saved, length
            if best is None:
                return None
            self._saved.move_to_end(best)
            return best, served

    def keep(self, saved: SavedPrompt) -> None:
        """Save ``saved`` in place of the prompts of its owner it holds all of (their
        tokens start its own, no more exactly), dropping the least recently used while
        the budget is exceeded; one larger than the budget is not kept."""
        if saved.size > self.budget:
            return
        with self._lock:
            for older in list(self._saved):
                if (
                    older.owner == saved.owner
                    and older.exact <= saved.exact
                    and common_prefix(older.tokens, saved.tokens) == len(older.tokens)
                ):
                    self._drop(older)
            self._saved[saved] = None
            self._size += saved.size
            while self._size > self.budget:
                self._drop(next(iter(self._saved)))

    def forget(self, saved: SavedPrompt) -> None:
        """Drop ``saved`` (one that could not be loaded), if still kept."""
        with self._lock:
            if saved in self._saved:
                self._drop(saved)

    def _drop(self, saved: SavedPrompt) -> None:
        del self._saved[saved]
        self._size -= saved.size
