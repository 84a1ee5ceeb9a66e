"""Cache breakpoints an alias sets where a request set none: after the tools, the system
prompt and the last user turn, within Anthropic's four; never over a client's own."""

from chatparity.protocol.breakpoints import (
    EPHEMERAL,
    MAX_BREAKPOINTS,
    cache_marked,
    with_breakpoints,
)
from chatparity.protocol.request import TextPart, parse_chat_request
from tests.support.wire import WEATHER

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def request(*messages, **body):
    return parse_chat_request({"model": "m", "messages": list(messages), **body})


def markers_of(chat):
    found = [("tool", tool.name) for tool in chat.tools if tool.cache_control]
    for i, message in enumerate(chat.messages):
        found += [(i, part.text) for part in message.parts if part.cache_control]
    return found


def test_the_tools_the_system_prompt_and_the_last_user_turn_are_marked():
    chat = with_breakpoints(
        request(
            {
                "role": "system",
                "content": [{"type": "text", "text": "Rules."}, {"type": "text", "text": "More."}],
            },
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Weather?"},
            tools=[WEATHER, {**WEATHER, "function": {"name": "other"}}],
        )
    )
    assert markers_of(chat) == [("tool", "other"), (0, "More."), (3, "Weather?")]
    assert chat.messages[3].parts == (TextPart("Weather?", EPHEMERAL),)
    assert chat.messages[3].content == "Weather?"
    assert len(markers_of(chat)) <= MAX_BREAKPOINTS
    assert "cache_control" not in str(chat.body), "nothing a chat upstream would be sent"


def test_a_tool_result_ending_the_conversation_is_the_last_user_turn():
    chat = with_breakpoints(
        request(
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": ""},
        )
    )
    assert markers_of(chat) == [(2, "")], "a result's block takes a marker, even empty"


def test_blank_text_takes_no_marker():
    chat = with_breakpoints(
        request(
            {"role": "system", "content": "  "},
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": " "},
        )
    )
    assert markers_of(chat) == [(1, "Hi")]


def test_a_request_with_a_marker_of_its_own_is_left_as_it_is():
    marked = {"type": "ephemeral", "ttl": "1h"}
    own = request(
        {
            "role": "system",
            "content": [{"type": "text", "text": "Rules.", "cache_control": marked}],
        },
        {"role": "user", "content": "Hi"},
        tools=[WEATHER],
    )
    assert cache_marked(own)
    assert with_breakpoints(own) is own
    unmarked = request({"role": "user", "content": "Hi"})
    assert not cache_marked(unmarked)
    assert cache_marked(with_breakpoints(unmarked))
