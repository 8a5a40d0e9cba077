"""What a request may say, and the limits that keep one request from hurting the others.

    {"prompt": "def ", "max_new_tokens": 64, "temperature": 0.8, "top_k": 40, "seed": 1}   -> generated text
    {"task": "score", "text": "The quick brown fox"}                                       -> log-likelihood
    {"task": "classify", "text": "What a lovely day"}                   -> label and probabilities (classifiers)

Which tasks an endpoint answers depends on its model (toolkit.deploy.serving.options.served_tasks): a language model
generates and scores, a sequence classifier classifies; a request without "task" asks for the model's first.

Every refusal is a :class:`RequestError` whose message names the field, the value and what is allowed; the
service answers it with HTTP 400 (or 413 for a body over the size limit). The local endpoint's HTTP layer
answers 408 to a client too slow to send its request within HEADER_TIMEOUT_S / BODY_TIMEOUT_S; a request not
answered within REQUEST_TIMEOUT_S gets 503.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from toolkit.errors import UserError, not_allowed, refused

MAX_BODY_BYTES = 64 * 1024
MAX_HEAD_BYTES = 16 * 1024  # request line and headers; a scoring request needs a few hundred bytes
HEADER_TIMEOUT_S = 20.0  # from connecting (or from the first byte of a kept-alive connection's next request)
BODY_TIMEOUT_S = 30.0  # from the end of the headers to the end of the body: a total, not a per-read, limit
REQUEST_TIMEOUT_S = 120.0  # from a whole request to its answer, waiting for the model included
MAX_PROMPT_BYTES = 4096
MAX_TEXT_BYTES = 16 * 1024
MAX_NEW_TOKENS = 512
MAX_TEMPERATURE = 5.0
_MAX_INT_DIGITS = 40  # longer integer literals are never valid here; converting them costs quadratic time
_SHOWN_CHARS = 40  # how much of a refused value a message repeats


class RequestError(UserError, ValueError):
    """A request the endpoint refuses; ``status`` is the HTTP code to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class GenerateRequest:
    prompt: bytes
    max_new_tokens: int
    temperature: float
    top_k: int
    seed: int | None
    top_p: float = 1.0  # nucleus sampling: the smallest set of tokens whose probability reaches top_p
    stop: tuple[str, ...] = ()  # the text ends before the first of these (which is not returned)
    prompt_ids: tuple[int, ...] | None = None  # the prompt already tokenized (a rendered chat template), else None
    stop_ids: frozenset[int] = frozenset()  # ids that end the text as the tokenizer's eos_ids do (a chat's turn end)


@dataclass(frozen=True)
class ScoreRequest:
    text: bytes


@dataclass(frozen=True)
class ClassifyRequest:
    text: bytes


class _LongNumber:
    """An integer literal too long to be any valid value: kept as its digit count, never converted."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def _number(digits: str) -> int | _LongNumber:
    return _LongNumber(digits) if len(digits) > _MAX_INT_DIGITS else int(digits)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """JSON objects with one value per name: two values for one field would be read differently by different
    parsers, so neither is chosen."""
    seen: dict = {}
    for name, value in pairs:
        if name in seen:
            raise RequestError(refused(shown(name, quote=False), "given twice", "each field once"))
        seen[name] = value
    return seen


def shown(value, quote: bool = True) -> str:
    """A refused value as a message repeats it: short, printable, and never a cost (no huge repr, no
    conversion of a huge integer, no recursion into a nested structure)."""
    if isinstance(value, _LongNumber):
        return f"a {value.digits:,}-digit number"
    if isinstance(value, (list, dict)):
        kind = "array" if isinstance(value, list) else "object"
        return f"a JSON {kind} of {len(value):,} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, str):
        text = repr(value) if quote else value.encode("unicode_escape").decode("ascii")
        return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}… ({len(value):,} characters)"
    return repr(value)


def _int(body: dict, name: str, default, low: int, high: int) -> int | None:
    value = body.get(name, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(refused(name, f"{shown(value)} is not allowed", f"an integer from {low} to {high:,}"))
    return value


def _text(body: dict, name: str, limit: int) -> bytes:
    value = body.get(name)
    allowed = f"a string of 1 to {limit:,} UTF-8 bytes"
    if not isinstance(value, str):
        raise RequestError(refused(name, f"{shown(value)} is not allowed", allowed))
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON can spell a lone surrogate ("\ud800"), which is no character
        raise RequestError(
            not_allowed(
                name, value[exc.start], allowed, problem=f"at character {exc.start:,} is a lone surrogate, not text"
            )
        ) from None
    if not data:
        raise RequestError(refused(name, "empty", allowed))
    if len(data) > limit:
        raise RequestError(refused(name, f"{len(data):,} bytes is over the limit", allowed))
    return data


def _generate(body: dict) -> GenerateRequest:
    temperature = body.get("temperature", 1.0)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0.0 <= temperature <= MAX_TEMPERATURE
    ):
        raise RequestError(
            refused(
                "temperature",
                f"{shown(temperature)} is not allowed",
                f"a number from 0 (greedy) to {MAX_TEMPERATURE:g}",
            )
        )
    return GenerateRequest(
        prompt=_text(body, "prompt", MAX_PROMPT_BYTES),
        max_new_tokens=_int(body, "max_new_tokens", 64, 1, MAX_NEW_TOKENS),
        temperature=float(temperature),
        top_k=_int(body, "top_k", 0, 0, 256),
        seed=_int(body, "seed", None, 0, 2**63 - 1),
    )


def _score(body: dict) -> ScoreRequest:
    return ScoreRequest(text=_text(body, "text", MAX_TEXT_BYTES))


def _classify(body: dict) -> ClassifyRequest:
    return ClassifyRequest(text=_text(body, "text", MAX_TEXT_BYTES))


TASKS = {
    "generate": (_generate, {"task", "prompt", "max_new_tokens", "temperature", "top_k", "seed"}),
    "score": (_score, {"task", "text"}),
    "classify": (_classify, {"task", "text"}),
}
TEXT_TASKS = ("generate", "score")  # what a language model answers, generate being the default


OPENAI_PREFIX = "/v1/"  # OpenAI's API (toolkit.deploy.serving.openai_api): its errors have OpenAI's shape


def openai_error(status: int, message: str, param: str | None = None) -> dict:
    """An error as OpenAI's API writes it, which the `openai` client turns into its own exceptions."""
    kind = {401: "authentication_error", 404: "not_found_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def error_body(target: bytes | str, message: str, status: int) -> dict:
    """The JSON of a refusal of a request for ``target`` (its path): OpenAI's shape under /v1, else /score's."""
    path = target.decode("latin-1") if isinstance(target, bytes) else target
    return openai_error(status, message) if path.startswith(OPENAI_PREFIX) else {"error": message}


def body_too_large(size: int | str) -> RequestError:
    """The one refusal of an oversized body, whoever notices it first (the HTTP layer or the service);
    ``size`` may be a Content-Length's digits, however many."""
    size = int(size) if len(str(size)) <= _MAX_INT_DIGITS else _LongNumber(size)
    shown_size = f"{size:,} bytes" if isinstance(size, int) else shown(size)
    return RequestError(refused("body", f"{shown_size} is over the limit", f"up to {MAX_BODY_BYTES:,}"), 413)


def json_body(body: bytes):
    """A request body as JSON: UTF-8, one value per name, integers of sane length, not nested too deeply."""
    try:
        text = body.decode("utf-8")  # RFC 8259: JSON between systems is UTF-8 (json.loads would guess UTF-16/32)
    except UnicodeDecodeError:
        raise RequestError(refused("body", "not UTF-8", "a JSON object")) from None
    try:
        return json.loads(text, parse_int=_number, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise RequestError(
            refused("body", f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", "a JSON object")
        ) from None
    except RecursionError:
        raise RequestError(refused("body", "JSON nested too deeply", "a JSON object of strings and numbers")) from None


def parse(body: bytes, tasks: tuple[str, ...] = TEXT_TASKS) -> GenerateRequest | ScoreRequest | ClassifyRequest:
    """A request body (bytes) to a validated request for one of ``tasks`` (the model's; a body without "task" asks
    for the first), or a RequestError saying what is wrong."""
    if len(body) > MAX_BODY_BYTES:
        raise body_too_large(len(body))
    data = json_body(body)
    if not isinstance(data, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(data), "number")
        raise RequestError(
            refused("body", f"a JSON {kind}", 'a JSON object such as {"prompt": "def ", "max_new_tokens": 32}')
        )
    task = data.get("task", tasks[0])
    if not isinstance(task, str) or task not in tasks:
        raise RequestError(refused("task", f"{shown(task)} is not allowed", ", ".join(tasks)))
    build, fields = TASKS[task]
    unknown = sorted(set(data) - fields)
    if unknown:
        raise RequestError(
            refused(shown(unknown[0], quote=False), f"unknown field for task {task!r}", ", ".join(sorted(fields)))
        )
    return build(data)
