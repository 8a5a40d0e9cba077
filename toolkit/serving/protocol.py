"""What a request may say, and the limits that keep one request from hurting the others.

    {"prompt": "def ", "max_new_tokens": 64, "temperature": 0.8, "top_k": 40, "seed": 1}   -> generated text
    {"task": "score", "text": "The quick brown fox"}                                       -> log-likelihood

Every refusal is a :class:`RequestError` whose message names the field, the value and what is allowed; the
service answers it with HTTP 400 (or 413 for a body over the size limit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_BODY_BYTES = 64 * 1024
MAX_PROMPT_BYTES = 4096
MAX_TEXT_BYTES = 16 * 1024
MAX_NEW_TOKENS = 512
MAX_TEMPERATURE = 5.0


class RequestError(ValueError):
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


@dataclass(frozen=True)
class ScoreRequest:
    text: bytes


def _int(body: dict, name: str, default, low: int, high: int) -> int | None:
    value = body.get(name, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{name}: {value!r} is not allowed; allowed: an integer from {low} to {high:,}")
    return value


def _text(body: dict, name: str, limit: int) -> bytes:
    value = body.get(name)
    if not isinstance(value, str):
        raise RequestError(f"{name}: {value!r} is not allowed; allowed: a string of 1 to {limit:,} UTF-8 bytes")
    data = value.encode("utf-8")
    if not data:
        raise RequestError(f"{name}: empty; allowed: a string of 1 to {limit:,} UTF-8 bytes")
    if len(data) > limit:
        raise RequestError(f"{name}: {len(data):,} bytes is over the limit; allowed: 1 to {limit:,} UTF-8 bytes")
    return data


def _generate(body: dict) -> GenerateRequest:
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise RequestError(f"temperature: {temperature!r} is not allowed; allowed: a number from 0 (greedy) to "
                           f"{MAX_TEMPERATURE:g}")
    return GenerateRequest(prompt=_text(body, "prompt", MAX_PROMPT_BYTES),
                           max_new_tokens=_int(body, "max_new_tokens", 64, 1, MAX_NEW_TOKENS),
                           temperature=float(temperature), top_k=_int(body, "top_k", 0, 0, 256),
                           seed=_int(body, "seed", None, 0, 2**63 - 1))


def _score(body: dict) -> ScoreRequest:
    return ScoreRequest(text=_text(body, "text", MAX_TEXT_BYTES))


TASKS = {"generate": (_generate, {"task", "prompt", "max_new_tokens", "temperature", "top_k", "seed"}),
         "score": (_score, {"task", "text"})}


def parse(body: bytes) -> GenerateRequest | ScoreRequest:
    """A request body (bytes) to a validated request, or a RequestError saying what is wrong."""
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(f"body: {len(body):,} bytes is over the limit; allowed: up to {MAX_BODY_BYTES:,}", 413)
    try:
        data = json.loads(body)
    except UnicodeDecodeError:
        raise RequestError("body: not UTF-8; allowed: a JSON object") from None
    except json.JSONDecodeError as exc:
        raise RequestError(f"body: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                           "allowed: a JSON object") from None
    if not isinstance(data, dict):
        raise RequestError(f"body: a JSON {type(data).__name__}; allowed: a JSON object such as "
                           '{"prompt": "def ", "max_new_tokens": 32}')
    task = data.get("task", "generate")
    if task not in TASKS:
        raise RequestError(f"task: {task!r} is not allowed; allowed: {', '.join(TASKS)}")
    build, fields = TASKS[task]
    unknown = sorted(set(data) - fields)
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field for task {task!r}; allowed: {', '.join(sorted(fields))}")
    return build(data)
