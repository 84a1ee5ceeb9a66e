"""The OpenAI Chat Completions wire format, independent of Django.

Requests come in through :func:`parse_chat_request`, which validates with the
schema table in :mod:`~chatparity.protocol.request` (nodes of
:mod:`~chatparity.protocol.schema`; the OpenAPI document is generated from the
same table), backends speak in :mod:`~chatparity.protocol.events`, and
:class:`ChunkEncoder` / :class:`CompletionAccumulator` turn those events into
the exact bytes OpenAI sends, streamed or not. OpenAI's enumerations (roles,
finish reasons, ...) are defined once, in :mod:`~chatparity.protocol.enums`.

The other wires are encodings of the same events, each parsed into the same chat
request: OpenAI's Responses API (:mod:`~chatparity.protocol.responses`,
``responses_stream``, ``responses_upstream``) and Anthropic's Messages API
(:mod:`~chatparity.protocol.messages`, ``messages_stream``, ``messages_upstream``).
"""
