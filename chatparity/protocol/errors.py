"""OpenAI's error envelope: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error the client sees in OpenAI's envelope with an HTTP status."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers: dict[str, str] = {}
        """Response headers that go with the error (``retry-after``, rate limits)."""

    def envelope(self) -> dict[str, Any]:
        """The JSON body OpenAI sends for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.type!r}, {self.code!r}, {self.message!r})"


def invalid_json() -> APIError:
    return APIError(
        "We could not parse the JSON body of your request. (HINT: This likely means you"
        " aren't using your HTTP library correctly. The OpenAI API expects a JSON payload,"
        " but what was sent was not valid JSON. If you have trouble figuring out how to fix"
        " this, please contact us through our help center at help.openai.com.)"
    )


def request_too_large(limit: int) -> APIError:
    """The body is larger than the server accepts (413), before it is decoded."""
    return APIError(
        f"Request too large: the request body exceeds the maximum size of {limit} bytes.",
        status=413,
        code="request_too_large",
    )


def missing_api_key() -> APIError:
    return APIError(
        "You didn't provide an API key. You need to provide your API key in an Authorization"
        " header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        status=401,
    )


def invalid_api_key(presented: str) -> APIError:
    shown = f"{presented[:3]}{'*' * 6}{presented[-4:]}" if len(presented) > 8 else "*" * 8
    return APIError(f"Incorrect API key provided: {shown}.", status=401, code="invalid_api_key")


def model_not_found(model: str) -> APIError:
    return APIError(
        f"The model `{model}` does not exist or you do not have access to it.",
        status=404,
        code="model_not_found",
    )


def not_a_chat_model(model: str) -> APIError:
    """A chat endpoint asked of an alias that serves embeddings only."""
    return APIError(
        f"The model `{model}` is an embedding model: it serves /v1/embeddings, not this endpoint.",
        param="model",
        code="model_not_supported",
    )


def not_an_embedding_model(model: str) -> APIError:
    """``/v1/embeddings`` asked of an alias that serves chat only."""
    return APIError(
        f"The model `{model}` does not serve embeddings: it is a chat model.",
        param="model",
        code="model_not_supported",
    )


class ContextLengthExceeded(APIError):
    """OpenAI's ``context_length_exceeded``, with its numbers (other wires word it their
    way): ``limit`` tokens in all, ``prompt_tokens`` in the prompt (at least), and
    ``completion_tokens`` asked for (0: none)."""

    def __init__(
        self, message: str, *, limit: int, prompt_tokens: int, completion_tokens: int
    ) -> None:
        super().__init__(message, param="messages", code="context_length_exceeded")
        self.limit = limit
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


def context_length_exceeded(
    limit: int, prompt_tokens: int, completion_tokens: int | None, *, at_least: bool = False
) -> ContextLengthExceeded:
    """OpenAI's error for a prompt of ``prompt_tokens`` that does not fit ``limit`` tokens
    with the ``completion_tokens`` asked (None: none were asked). ``at_least``: the
    prompt was not tokenized, ``prompt_tokens`` is a lower bound, said so."""
    counted = "at least " if at_least else ""
    if completion_tokens is None:
        asked = f"your messages resulted in {counted}{prompt_tokens} tokens"
        reduce = "the messages"
    else:
        asked = (
            f"you requested {counted}{prompt_tokens + completion_tokens} tokens ({counted}"
            f"{prompt_tokens} in the messages, {completion_tokens} in the completion)"
        )
        reduce = "the messages or completion"
    return ContextLengthExceeded(
        f"This model's maximum context length is {limit} tokens. However, {asked}. Please"
        f" reduce the length of {reduce}.",
        limit=limit,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens or 0,
    )


def server_error(
    message: str = "The server had an error while processing your request.",
    *,
    code: str | None = None,
) -> APIError:
    return APIError(message, status=500, type="server_error", code=code)


def timed_out(message: str) -> APIError:
    """A 504: a backend (an upstream, a program, the model) did not answer in time."""
    return APIError(message, status=504, type="timeout_error", code="request_timeout")


def service_unavailable(message: str) -> APIError:
    """A 503: something the gateway needs (its database, its counters) is away for now."""
    return APIError(message, status=503, type="server_error", code="service_unavailable")


def model_unavailable(message: str) -> APIError:
    """A 503: this server cannot load the alias's model (a package or a file missing);
    ``message`` says how to fix it."""
    return APIError(message, status=503, type="server_error", code="model_unavailable")


def as_api_error(exc: BaseException) -> APIError:
    """``exc`` itself when it is an :class:`APIError`; else a generic 500, which
    tells the client nothing of the internals."""
    return exc if isinstance(exc, APIError) else server_error()
