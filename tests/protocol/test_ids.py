"""The ids each wire hands out, in its provider's form, and a tool call's id between
OpenAI's wires and Anthropic's."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatparity.protocol.ids import (
    anthropic_id,
    call_id,
    call_id_of,
    completion_id,
    random_id,
    request_id,
    tool_use_id,
)

FORMS = [
    (request_id, r"req_[0-9a-f]{32}"),
    (completion_id, r"chatcmpl-[A-Za-z0-9]{29}"),
    (call_id, r"call_[A-Za-z0-9]{24}"),
    (lambda: random_id("resp"), r"resp_[0-9a-f]{50}"),
    (lambda: random_id("fc"), r"fc_[0-9a-f]{50}"),
    (lambda: anthropic_id("msg"), r"msg_01[1-9A-HJ-NP-Za-km-z]{22}"),  # base58
]


@pytest.mark.parametrize(("make", "form"), FORMS, ids=[form for _, form in FORMS])
def test_each_id_is_made_in_its_providers_form_and_never_twice(make, form):
    made = {make() for _ in range(1000)}
    assert len(made) == 1000
    assert all(re.fullmatch(form, each) for each in made)


def test_an_openai_call_id_is_anthropics_tool_use_id_with_the_same_characters():
    assert tool_use_id("call_" + "Ab1" * 8) == "toolu_" + "Ab1" * 8
    assert call_id_of("toolu_" + "Ab1" * 8) == "call_" + "Ab1" * 8
    made = call_id()
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", tool_use_id(made))


def test_anthropics_own_tool_use_ids_are_openai_call_ids():
    assert call_id_of("toolu_01KFbKqPYSuAKujiL6mTfzYA") == "call_01KFbKqPYSuAKujiL6mTfzYA"


@given(st.text())
def test_any_call_id_comes_back_as_itself_through_a_tool_use_id(call):
    used = tool_use_id(call)
    assert call_id_of(used) == call
    assert re.fullmatch(r"toolu_[A-Za-z0-9_-]*", used)  # as Anthropic's tool_use ids are


@pytest.mark.parametrize(
    "made_up",
    ["toolu_01", "my-tool-1", "call_1", "toolu__!!", "toolu__YWJj!", "toolu__////"],
)
def test_an_id_a_client_made_up_stands_for_itself(made_up):
    assert call_id_of(made_up) == made_up
