"""The OpenAI Chat Completions wire format, independent of Django.

Requests come in through :func:`parse_chat_request`, backends speak in
:mod:`~chatparity.protocol.events`, and :class:`ChunkEncoder` /
:class:`CompletionAccumulator` turn those events into the exact bytes OpenAI
sends, streamed or not.
"""
