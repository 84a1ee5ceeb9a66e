"""The conformance framework: probes, readers, judges, checks and the runner.

Any server (``BASE_URL`` like ``http://127.0.0.1:8000/v1``) is probed with raw
httpx, so defects an SDK would paper over stay visible, and judged against the
canonical contract (see ``DESIGN.md``). No Django imports; ``manage.py
chatparity_conformance`` is a thin wrapper.

Every check is a :class:`Check`: the requests (:class:`Probe`) it needs and a pure
*judge* that turns the responses into a list of problems (empty means PASS).
Identical probes are sent once per run, and judges never touch the network, so they
can be fed recorded or handcrafted responses. Each API's checks are a module of their
own with a ``CHECKS`` table (:mod:`.chat`, :mod:`.responses`), listed in :mod:`.suite`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeGuard, TypeVar

import httpx

ERROR_KEYS = frozenset({"message", "type", "param", "code"})
INVALID = "invalid_request_error"
UNKNOWN_ARGUMENT = "chatparity_conformance_bogus"
BAD_KEY = "sk-chatparity-conformance-invalid-0000"

# What every API's checks ask, each in its own API's shape.
HELLO_PROMPT = "Say hello in one short sentence."
STORY_PROMPT = "Tell me a long story about a dragon."
WEATHER_PROMPT = "What is the weather like in Paris today?"
GET_WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()
"""A probe body value that removes the key from the default request body."""


# Requests.


@dataclass(frozen=True)
class Probe:
    """One request a check needs: ``body`` merged over the model and the API's
    :attr:`defaults` (a subclass per API sets them and its ``path``)."""

    body: Mapping[str, Any] = field(default_factory=dict)
    method: str = "POST"
    path: str = ""
    bad_key: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    """Sent besides the key (a browser's ``Origin``, say)."""
    defaults: ClassVar[Mapping[str, Any]] = {}

    def request_body(self, model: str) -> dict[str, Any] | None:
        if self.method in ("GET", "OPTIONS"):
            return None
        base = {"model": model, **self.defaults}
        return {key: value for key, value in {**base, **self.body}.items() if value is not OMIT}

    def cache_key(self, model: str) -> str:
        body = json.dumps(self.request_body(model), sort_keys=True)
        return f"{self.method} {self.path} {self.bad_key} {self.headers} {body}"

    def model_of(self, runner: Runner) -> str:
        """The model this probe asks for: the run's (an API for another kind of model
        says which)."""
        return runner.model

    def send(self, runner: Runner) -> httpx.Response:
        """Make the request; a probe that needs another's response first asks ``runner``."""
        headers = dict(self.headers)
        if self.bad_key:
            headers["Authorization"] = f"Bearer {BAD_KEY}"
        body = self.request_body(self.model_of(runner))
        request = runner.http.build_request(self.method, self.path, json=body, headers=headers)
        if self.method == "OPTIONS":
            del request.headers["authorization"]  # a browser's preflight carries no key
        return runner.http.send(request)


# Reading responses.


class Problems:
    """Problems found in one response; a problem seen in many chunks is reported once."""

    def __init__(self) -> None:
        self._where: dict[str, list[int]] = {}

    def add(self, message: str, chunk: int | None = None) -> None:
        self._where.setdefault(message, [])
        if chunk is not None:
            self._where[message].append(chunk)

    def extend(self, messages: Iterable[str]) -> None:
        for message in messages:
            self.add(message)

    def render(self) -> list[str]:
        rendered = []
        for message, where in self._where.items():
            if len(where) == 1:
                message += f" (chunk #{where[0]})"
            elif where:
                message += f" ({len(where)} chunks, first #{where[0]})"
            rendered.append(message)
        return rendered


def short(value: Any, limit: int = 60) -> str:
    """``value`` as compact JSON, cut to ``limit`` characters."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def keys_of(value: Any) -> str:
    """A dict's keys, sorted and joined, or the type of what is not a dict."""
    return ", ".join(sorted(value)) if isinstance(value, dict) else type(value).__name__


def field_is(obj: dict[str, Any], key: str, where: str) -> str:
    """``where.key is <value>``, or ``where lacks key``."""
    return f"{where}.{key} is {short(obj[key])}" if key in obj else f"{where} lacks {key}"


def status_code_problems(response: httpx.Response, expected: int = 200) -> list[str]:
    """A response not of the ``expected`` HTTP status, as a problem naming what came instead."""
    if response.status_code == expected:
        return []
    kind = response.headers.get("content-type", "no content-type").split(";")[0]
    body = response.content[:80].decode("utf-8", "replace")
    return [f"HTTP {response.status_code} ({kind}), expected {expected}: {body}"]


def json_body(response: httpx.Response, status: int = 200) -> tuple[Any, list[str]]:
    """The JSON object a response with ``status`` carries, or the problems that
    stop it being judged; a wrong Content-Type is a problem but not a stopper."""
    problems = status_code_problems(response, status)
    if problems:
        return None, problems
    if not response.headers.get("content-type", "").startswith("application/json"):
        problems.append(f"Content-Type is {response.headers.get('content-type')!r}")
    try:
        body = json.loads(response.content)
    except ValueError:
        return None, [*problems, f"body is not JSON: {short(response.text)}"]
    if not isinstance(body, dict):
        return None, [*problems, f"body is not a JSON object: {short(body)}"]
    return body, problems


# Judges: responses -> problems.

Judge = Callable[[str, Sequence[httpx.Response]], list[str]]
"""Takes the requested model and the responses to a check's probes, in order."""
Parsed = TypeVar("Parsed")


def judge_json(*inspect: Callable[[dict[str, Any], str], list[str]]) -> Judge:
    """Judge one JSON object response (a 200) with ``inspect``."""

    def judge(model: str, responses: Sequence[httpx.Response]) -> list[str]:
        body, problems = json_body(responses[0])
        if body is None:
            return problems
        return problems + [problem for check in inspect for problem in check(body, model)]

    return judge


def judge_parsed(
    parse: Callable[[httpx.Response], tuple[Parsed | None, list[str]]],
    *inspect: Callable[[Parsed, str], list[str]],
) -> Judge:
    """Judge one response as ``parse`` reads it (its problems alone when it cannot),
    then with ``inspect``."""

    def judge(model: str, responses: Sequence[httpx.Response]) -> list[str]:
        parsed, problems = parse(responses[0])
        if parsed is None:
            return problems
        return [problem for check in inspect for problem in check(parsed, model)]

    return judge


def listed(
    response: httpx.Response, expected: str
) -> tuple[dict[str, Any], list[Any] | None, list[str]]:
    """An OpenAI list object (``object: "list"``), its ``data`` and its problems; the data
    None when there is none to look at: no JSON, or not the ``expected`` non-empty list."""
    body, problems = json_body(response)
    if body is None:
        return {}, None, problems
    if body.get("object") != "list":
        problems.append(f"object is {short(body.get('object'))}, expected 'list'")
    data = body.get("data")
    if not isinstance(data, list) or not data:
        return body, None, [*problems, f"data is {short(data)}, expected {expected}"]
    return body, data, problems


def judge_all(*judges: Judge) -> Judge:
    """Every problem each of ``judges`` finds."""

    def judge(model: str, responses: Sequence[httpx.Response]) -> list[str]:
        return [problem for each in judges for problem in each(model, responses)]

    return judge


def judge_error(status: int, **expected: Any) -> Judge:
    """An error before the first byte: HTTP ``status``, JSON, and exactly
    ``{"error": {message, type, param, code}}`` with the ``expected`` values."""

    def judge(model: str, responses: Sequence[httpx.Response]) -> list[str]:
        body, problems = json_body(responses[0], status)
        if body is None:
            return problems
        error = body.get("error")
        if body.keys() != {"error"} or not isinstance(error, dict):
            return [*problems, f'body is {short(body)}, expected {{"error": {{...}}}}']
        if error.keys() != ERROR_KEYS:
            problems.append(f"error keys are {keys_of(error)}, expected code, message, param, type")
        if not isinstance(error.get("message"), str) or not error["message"]:
            problems.append(f"error.message is {short(error.get('message'))}")
        problems += [
            f"{field_is(error, key, 'error')}, expected {short(value)}"
            for key, value in expected.items()
            if error.get(key, OMIT) != value
        ]
        return problems

    return judge


# The table.


@dataclass(frozen=True)
class Check:
    """One row of the report: what to send, and how to judge what comes back."""

    name: str
    description: str
    probes: tuple[Probe, ...]
    judge: Judge


def select(
    checks: Sequence[Check], *, only: Sequence[str] = (), skip: Sequence[str] = ()
) -> list[Check]:
    """The checks whose name contains one of ``only`` (all when empty) and none of ``skip``."""
    return [
        check
        for check in checks
        if (not only or any(part in check.name for part in only))
        and not any(part in check.name for part in skip)
    ]


# Running.


@dataclass(frozen=True)
class Result:
    name: str
    problems: tuple[str, ...] = ()
    description: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def reason(self, limit: int = 3) -> str:
        """The first ``limit`` problems, joined."""
        shown = "; ".join(self.problems[:limit])
        more = len(self.problems) - limit
        return shown + (f" (+{more} more)" if more > 0 else "")


class ConformanceError(Exception):
    """The run cannot start (no model to test)."""


def client(base_url: str, key: str, timeout: float = 60.0, **options: Any) -> httpx.Client:
    """An httpx client for ``base_url`` (``.../v1``) sending ``key`` as a bearer token."""
    return httpx.Client(
        base_url=base_url.rstrip("/"),
        headers={"Authorization": f"Bearer {key}"},
        timeout=timeout,
        **options,
    )


class Runner:
    """Sends each distinct probe once and judges every check on the responses."""

    def __init__(self, http: httpx.Client, model: str, embedding_model: str = "") -> None:
        self.http = http
        self.model = model
        self.embedding_model = embedding_model
        """What embeddings probes ask for (empty: the run has none, nor such checks)."""
        self._sent: dict[str, httpx.Response | httpx.HTTPError] = {}

    def send(self, probe: Probe) -> httpx.Response:
        key = probe.cache_key(probe.model_of(self))
        if key not in self._sent:
            try:
                self._sent[key] = probe.send(self)
            except httpx.HTTPError as exc:
                self._sent[key] = exc
        sent = self._sent[key]
        if isinstance(sent, httpx.HTTPError):
            raise sent
        return sent

    def run(self, check: Check) -> Result:
        try:
            responses = [self.send(probe) for probe in check.probes]
        except httpx.HTTPError as exc:
            problems = [f"request failed: {type(exc).__name__}: {exc}"]
            return Result(check.name, tuple(problems), check.description)
        try:
            model = check.probes[0].model_of(self) if check.probes else self.model
            problems = check.judge(model, responses)
        except Exception as exc:  # a judge bug must not hide the other rows
            problems = [f"could not judge the response: {exc!r}"]
        return Result(check.name, tuple(problems), check.description)

    def run_all(self, checks: Iterable[Check]) -> list[Result]:
        """Each check's result; a check whose probes ask for no model (embeddings, when
        the run has no embedding model) is not run."""
        return [self.run(c) for c in checks if not c.probes or c.probes[0].model_of(self)]


def model_ids(http: httpx.Client) -> list[str]:
    """The model ids GET /models lists, in its order."""
    try:
        response = http.get("/models")
        response.raise_for_status()
        ids = [str(model["id"]) for model in response.json()["data"]]
    except (httpx.HTTPError, ValueError, AttributeError, LookupError, TypeError):
        ids = []
    if not ids:
        raise ConformanceError("could not read a model id from GET /models; pass --model")
    return ids


def is_embedding_model(model: str) -> bool:
    """Whether a model's id names it an embedding model, as OpenAI's do (``embed`` in it)."""
    return "embed" in model.lower()


def first_model(ids: Sequence[str]) -> str:
    """The model to test chat on: the first of ``ids`` that is not an embedding model's."""
    return next((model for model in ids if not is_embedding_model(model)), ids[0])


def first_embedding_model(ids: Sequence[str]) -> str:
    """The model to test embeddings on: the first of ``ids`` named as one (else none)."""
    return next((model for model in ids if is_embedding_model(model)), "")


def format_table(results: Sequence[Result]) -> str:
    """One row per check (name, PASS/FAIL, reason), then a summary line."""
    width = max((len(result.name) for result in results), default=5)
    lines = [f"{'CHECK':<{width}}  RESULT  REASON"]
    lines += [
        f"{result.name:<{width}}  {'PASS' if result.ok else 'FAIL':<6}  {result.reason()}".rstrip()
        for result in results
    ]
    failed = sum(not result.ok for result in results)
    lines.append(f"{len(results)} checks: {len(results) - failed} passed, {failed} failed")
    return "\n".join(lines)


def as_json(base_url: str, model: str, results: Sequence[Result]) -> dict[str, Any]:
    """The results as a JSON-ready object."""
    return {
        "base_url": base_url,
        "model": model,
        "passed": all(result.ok for result in results),
        "checks": [
            {
                "name": r.name,
                "description": r.description,
                "ok": r.ok,
                "reason": r.reason(),
                "problems": list(r.problems),
            }
            for r in results
        ],
    }


__all__ = [
    "Check",
    "ConformanceError",
    "Judge",
    "Probe",
    "Problems",
    "Result",
    "Runner",
    "as_json",
    "client",
    "first_embedding_model",
    "first_model",
    "format_table",
    "is_embedding_model",
    "judge_error",
    "judge_json",
    "judge_parsed",
    "model_ids",
    "select",
]
