"""The ids each wire hands out, in its provider's form, and the translation of a tool
call's id between the two families of wires.

OpenAI's: ``req_`` and 32 hex digits (a request), ``chatcmpl-`` and 29 letters or
digits (a chat completion), ``call_`` and 24 (a tool call), ``resp_``, ``msg_`` and
``fc_`` and 50 hex digits (the Responses API's objects). Anthropic's: ``msg_`` and
``toolu_`` and 24 letters or digits, ``01`` then 22 of base58 where Anthropic makes
them (a message, a tool use).

A tool call's id is made by the backend that called it (the local model makes
OpenAI's form, an OpenAI upstream sends it, an Anthropic upstream's is read back
with :func:`call_id_of`) and carried in the conversation a client sends back.
:func:`tool_use_id` is its id on Anthropic's wires, :func:`call_id_of` the way
back: ``call_`` and 24 letters or digits is ``toolu_`` and the same 24; any other
id is encoded whole, so that whatever a backend made, it gets its own ids back.
"""

from __future__ import annotations

import base64
import binascii
import os
import random
import re
import string

# Ids only need to be unique, not secret: drawn from a generator seeded once per
# process (again after a fork), not from a system call per request, which under
# load makes the event loop wait for the GIL.
_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))
# A byte modulo 62 favours the first eight characters a little, which an id does not mind.
_ALPHANUMERIC = (string.ascii_letters + string.digits).encode()
_TO_ALPHANUMERIC = bytes(_ALPHANUMERIC[byte % 62] for byte in range(256))
_BASE58 = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_TO_BASE58 = bytes(_BASE58[byte % 58] for byte in range(256))


def request_id() -> str:
    """A request's id (``x-request-id``), as OpenAI's."""
    return f"req_{_ids.getrandbits(128):032x}"


def _alphanumeric(length: int) -> str:
    return _ids.randbytes(length).translate(_TO_ALPHANUMERIC).decode()


def completion_id() -> str:
    """A chat completion's id: ``chatcmpl-`` and 29 letters or digits."""
    return "chatcmpl-" + _alphanumeric(29)


def call_id() -> str:
    """A tool call's id, for a backend's call that came without one: ``call_`` and 24
    letters or digits."""
    return "call_" + _alphanumeric(24)


def random_id(prefix: str) -> str:
    """An id as OpenAI's Responses API makes them: ``resp_``, ``msg_``, ``fc_`` and 50
    hex digits."""
    return f"{prefix}_{_ids.getrandbits(200):050x}"


def anthropic_id(prefix: str) -> str:
    """An id as Anthropic makes them: ``msg_`` (say), ``01`` and 22 of base58."""
    return f"{prefix}_01{_ids.randbytes(22).translate(_TO_BASE58).decode()}"


_CALL = re.compile(r"call_([A-Za-z0-9]{24})")
_TOOL_USE = re.compile(r"toolu_([A-Za-z0-9]{24})")
_ENCODED = "toolu__"
"""How a :func:`tool_use_id` of a call id in another form begins (the ``_`` is never
one of the 24 characters of the other kind)."""


def tool_use_id(call: str) -> str:
    """The id of the tool call ``call`` on Anthropic's wires: ``toolu_`` and the 24
    characters of ``call_`` and 24 letters or digits, else ``toolu__`` and ``call``
    in base64url, so that :func:`call_id_of` gives ``call`` back whatever it is."""
    matched = _CALL.fullmatch(call)
    if matched:
        return "toolu_" + matched[1]
    return _ENCODED + base64.urlsafe_b64encode(call.encode()).decode().rstrip("=")


def call_id_of(tool_use: str) -> str:
    """The tool call id a ``tool_use`` id of Anthropic's wires stands for (the inverse
    of :func:`tool_use_id`); an id it never made stands for itself, or for ``call_``
    and its 24 characters when it is Anthropic's ``toolu_`` and 24."""
    matched = _TOOL_USE.fullmatch(tool_use)
    if matched:
        return "call_" + matched[1]
    if tool_use.startswith(_ENCODED):
        encoded = tool_use[len(_ENCODED) :]
        try:
            call = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            return tool_use
        if tool_use_id(call) == tool_use:  # not one a client made up that decodes loosely
            return call
    return tool_use
