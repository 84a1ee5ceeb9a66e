"""The local model's prompt cache: which saved prompt serves a prompt, how much of it, and
what is kept within the budget (states of made-up sizes; the real model's are in
test_local.py)."""

import ctypes

import numpy as np

from chatparity.backends.prompt_cache import (
    BLOCK_TOKENS,
    PromptCache,
    SavedPrompt,
    exact_after,
    reusable,
)


def tokens(*values):
    return np.array(values, dtype=np.intc)


def saved(owner, held, exact=0, state_bytes=1000):
    return SavedPrompt(
        owner, np.asarray(held, dtype=np.intc), exact, (ctypes.c_uint8 * state_bytes)()
    )


LONG = np.arange(1, 1001, dtype=np.intc)


def test_the_callers_saved_prompt_serving_most_of_the_prompt_is_found():
    cache = PromptCache(10**6)
    short, longer = saved("a", LONG[:100]), saved("a", np.append(LONG[:300], [7, 7]))
    cache.keep(short)
    cache.keep(longer)
    assert cache.find("a", LONG[:500], reproducible=False) == (longer, 300)


def test_another_callers_saved_prompt_is_never_served():
    cache = PromptCache(10**6)
    cache.keep(saved("a", LONG))
    assert cache.find("b", LONG, reproducible=False) is None


def test_a_prompt_differing_in_one_token_in_the_middle_is_served_up_to_that_token_only():
    cache = PromptCache(10**6)
    cache.keep(saved("a", LONG, exact=1000 // BLOCK_TOKENS * BLOCK_TOKENS))
    changed = LONG.copy()
    changed[421] = 0
    assert cache.find("a", changed, reproducible=False)[1] == 421
    assert cache.find("a", changed, reproducible=True)[1] == 421 // BLOCK_TOKENS * BLOCK_TOKENS


def test_the_last_token_of_a_prompt_is_always_evaluated():
    cache = PromptCache(10**6)
    cache.keep(saved("a", LONG[:200]))
    assert cache.find("a", LONG[:200], reproducible=False)[1] == 199
    assert cache.find("a", LONG[:1], reproducible=False) is None


def test_a_reproducible_prompt_is_served_whole_blocks_computed_as_from_nothing_only():
    assert reusable(1000, exact=640, length=2000, reproducible=True) == 640
    assert reusable(1000, exact=1000, length=2000, reproducible=True) == 960
    assert reusable(1000, exact=0, length=2000, reproducible=True) == 0
    assert reusable(1000, exact=0, length=2000, reproducible=False) == 1000
    assert reusable(100, exact=128, length=101, reproducible=True) == 64


def test_cells_evaluated_after_a_block_boundary_reused_as_from_nothing_stay_exact():
    # From nothing, or from a boundary all of whose cells were exact: whole blocks exact.
    assert exact_after(0, 0, 300) == 256
    assert exact_after(128, 192, 300) == 256
    # From elsewhere: exact no further than the last boundary before either.
    assert exact_after(130, 192, 300) == 128
    assert exact_after(128, 100, 300) == 64


def test_past_its_budget_the_least_recently_used_are_dropped_and_the_total_stays_within():
    cache = PromptCache(3500)
    prompts = [saved("a", [n, 1, 2, 3]) for n in range(10)]
    for kept, prompt in enumerate(prompts):
        cache.keep(prompt)
        assert cache.size <= 3500
        assert cache.saved() == prompts[max(0, kept - 2) : kept + 1]
    assert cache.size == sum(prompt.size for prompt in prompts[-3:])


def test_a_saved_prompt_served_is_dropped_after_those_not_served_since():
    cache = PromptCache(3500)
    first, second, third = (saved("a", [n, 1, 2, 3]) for n in range(3))
    for prompt in (first, second, third):
        cache.keep(prompt)
    cache.find("a", tokens(0, 1, 2, 3, 4), reproducible=False)
    cache.keep(saved("a", [9, 1, 2, 3]))
    assert second not in cache.saved()
    assert first in cache.saved()


def test_a_saved_prompt_larger_than_the_budget_is_not_kept_nor_drops_others():
    cache = PromptCache(3500)
    small = saved("a", [1, 2])
    cache.keep(small)
    cache.keep(saved("a", [3, 4], state_bytes=3500))
    assert cache.saved() == [small]
    none = PromptCache(0)
    none.keep(saved("a", [1, 2], state_bytes=1))
    assert (none.saved(), none.size) == ([], 0)


def test_a_saved_prompt_replaces_its_owners_it_holds_all_of_but_not_more_exactly():
    cache = PromptCache(10**6)
    ancestor = saved("a", LONG[:100], exact=64)
    sharper = saved("a", LONG[:200], exact=192)
    sibling = saved("a", np.append(LONG[:100], [5]))
    others = saved("b", LONG[:100])
    for prompt in (ancestor, sharper, sibling, others):
        cache.keep(prompt)
    descendant = saved("a", LONG[:400], exact=128)
    cache.keep(descendant)
    assert cache.saved() == [sharper, sibling, others, descendant]
    assert cache.size == sum(prompt.size for prompt in cache.saved())


def test_a_saved_prompt_forgotten_is_no_longer_served():
    cache = PromptCache(10**6)
    prompt = saved("a", LONG)
    cache.keep(prompt)
    cache.forget(prompt)
    cache.forget(prompt)  # already gone: nothing to do
    assert cache.find("a", LONG, reproducible=False) is None
    assert cache.size == 0


def test_the_size_of_a_saved_prompt_counts_its_state_and_its_tokens():
    prompt = saved("a", LONG, state_bytes=5)
    assert prompt.size == 5 + LONG.nbytes
