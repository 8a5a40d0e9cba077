"""OpenAI's API beside Azure ML's scoring contract: the same model, key, limits, batcher and KV cache.

    GET  /v1/models              the one model this endpoint serves
    POST /v1/chat/completions    messages rendered by the model's chat template (ChatML when it has none, as
                                 training rendered them: toolkit.data.chat); the answer ends at the template's
                                 end-of-turn marker, an end-of-sequence id, a `stop` string or max_tokens
    POST /v1/completions         a prompt continued, as POST /score's generate task does

Fields (both): max_tokens (chat: or max_completion_tokens; default: what fits the context, up to 512), temperature
(0 to 2; default 1), top_p (0 to 1), stop (a string or up to 4, each up to 256 characters), seed, n (1 to 4; 1 when
streaming), stream (server-sent events, `data: [DONE]` last), stream_options.include_usage, and `model` (any name:
the endpoint has one model, whose name every answer gives); in a chat's messages, an assistant's tool_calls as
OpenAI's API takes them. Anything else is refused naming the field, as a 4xx in OpenAI's error shape, so the
`openai` client raises its own exceptions (BadRequestError, AuthenticationError). HTTP-free: score.py adapts it.
"""

from __future__ import annotations

import json
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

from toolkit.deploy.serving.protocol import (
    MAX_BODY_BYTES,
    MAX_NEW_TOKENS,
    GenerateRequest,
    RequestError,
    body_too_large,
    json_body,
    openai_error,
    shown,
)
from toolkit.deploy.serving.service import ScoringService, authorised, log
from toolkit.data.documents import template_tool_call, tool_call_arguments
from toolkit.errors import refused
from toolkit.plain_data import PlainDataError

MAX_N = 4
MAX_STOPS = 4
# Each token streamed looks for every stop string's beginnings at the end of the text (what to hold back), work that
# grows with the square of a stop string's length, in the thread that generates for every client: stop strings
# are markers ("\n\n", "</answer>", "Observation:")
MAX_STOP_CHARS = 256
MAX_TEMPERATURE = 2.0  # OpenAI's range
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
COMMON = {"model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream", "stream_options", "user"}
FIELDS = {"chat": COMMON | {"messages", "max_completion_tokens"}, "completions": COMMON | {"prompt"}}
STREAM_POLL_S = 0.25  # how often a stream with nothing new looks at its deadline

Answer = tuple[int, dict] | Iterator[bytes]  # (status, JSON body), or a stream of server-sent events


def error(status: int, message: str, param: str | None = None) -> tuple[int, dict]:
    return status, openai_error(status, message, param)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(refused(name, f"{shown(value)} is not allowed", f"a number from {low:g} to {high:g}"))
    return float(value)


def _integer(body: dict, name: str, default, low: int, high: int):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(refused(name, f"{shown(value)} is not allowed", f"an integer from {low} to {high:,}"))
    return value


def _stop_fits(stop) -> bool:
    return isinstance(stop, str) and 0 < len(stop) <= MAX_STOP_CHARS


def _stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    stops = [] if value is None else [value] if isinstance(value, str) else value
    allowed = f"a non-empty string of up to {MAX_STOP_CHARS} characters, or a list of up to {MAX_STOPS}"
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(map(_stop_fits, stops)):
        raise RequestError(refused("stop", f"{shown(value)} is not allowed", allowed))
    return tuple(stops)


def _content(value, turn: int) -> str:
    """A message's content: text, or OpenAI's list of parts of which only text parts are read."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        if all(isinstance(p.get("text"), str) for p in value):
            return "".join(p["text"] for p in value)
    raise RequestError(
        refused(f"messages[{turn}].content", f"{shown(value)} is not allowed", "text, or a list of text parts")
    )


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(refused("messages", f"{shown(messages)} is not allowed", "a non-empty list of messages"))
    read = []
    for turn, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise RequestError(refused(f"messages[{turn}].role", f"{shown(role)} is not allowed", ", ".join(ROLES)))
        out: dict = {"role": ROLES[role], "content": _content(message.get("content"), turn)}
        if message.get("tool_calls") is not None:
            if role != "assistant":
                raise RequestError(
                    refused(f"messages[{turn}].tool_calls", f"is not allowed in a {role} message", "an assistant's")
                )
            out["tool_calls"] = _tool_calls(message["tool_calls"], turn)
        for name in ("tool_call_id", "name"):
            if message.get(name) is not None:
                if not isinstance(message[name], str):
                    raise RequestError(
                        refused(f"messages[{turn}].{name}", f"{shown(message[name])} is not allowed", "a string")
                    )
                out[name] = message[name]
        read.append(out)
    return read


TOOL_CALL = '{"id": "...", "type": "function", "function": {"name": "...", "arguments": "a JSON string"}}'


def _tool_calls(calls, turn: int) -> list[dict]:
    """An assistant message's tool calls, checked as OpenAI checks them, in the shape templates take
    (toolkit.data.documents: arguments parsed, nothing else of each object passed on)."""
    field = f"messages[{turn}].tool_calls"
    if not isinstance(calls, list) or not calls:
        raise RequestError(refused(field, f"{shown(calls)} is not allowed", f"a non-empty list of {TOOL_CALL}"))
    checked = []
    for j, call in enumerate(calls):
        place = f"{field}[{j}]"
        if not isinstance(call, dict):
            raise RequestError(refused(place, f"{shown(call)} is not allowed", TOOL_CALL))
        function = call.get("function")
        name, arguments = (function.get("name"), function.get("arguments")) if isinstance(function, dict) else ("", "")
        wanted = [
            (f"{place}.id", call.get("id"), isinstance(call.get("id"), str), "a string"),
            (f"{place}.type", call.get("type"), call.get("type") == "function", '"function"'),
            (f"{place}.function", function, isinstance(function, dict), '{"name": "...", "arguments": "..."}'),
            (f"{place}.function.name", name, isinstance(name, str) and bool(name), "a non-empty string"),
            (f"{place}.function.arguments", arguments, isinstance(arguments, str), "a string (JSON)"),
        ]
        for field, value, fits, allowed in wanted:
            if not fits:
                raise RequestError(refused(field, f"{shown(value)} is not allowed", allowed))
        try:
            parsed = tool_call_arguments(arguments)
        except PlainDataError as exc:
            raise RequestError(refused(f"{place}.function.arguments", str(exc), "plain JSON")) from None
        checked.append(template_tool_call(call, str(name), parsed))
    return checked


class OpenAIRoutes:
    """The /v1 routes of one endpoint, over its :class:`ScoringService` (the model, the batcher, the key)."""

    def __init__(self, service: ScoringService):
        from toolkit.data.chat import ChatTemplate

        self.service = service
        self.model = service.info["run"]
        self.template = ChatTemplate(service.runtime.tokenizer)
        end = self.template.turn_end()
        self.turn_end = (end,) if end else ()  # as text (ChatML's '<|im_end|>' in bytes)
        end_id = self.template.turn_end_id()
        self.turn_end_ids = frozenset() if end_id is None else frozenset([end_id])  # as a special token

    def models(self, authorization: str | None) -> tuple[int, dict]:
        if not authorised(self.service.key, authorization):
            return self._unauthorised(authorization)
        return 200, {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "trainbook"}],
        }

    def answer(
        self,
        kind: str,
        authorization: str | None,
        content_length: int | None,
        read_body: Callable[[int], bytes],
        client_gone: Callable[[], bool] | None = None,
    ) -> Answer:
        """One POST to /v1/chat/completions (``kind`` 'chat') or /v1/completions ('completions')."""
        if not authorised(self.service.key, authorization):
            return self._unauthorised(authorization)
        started = time.perf_counter()
        try:
            if content_length is not None and content_length > MAX_BODY_BYTES:
                raise body_too_large(content_length)
            body = read_body(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                raise body_too_large(len(body))
            data = json_body(body)
            if not isinstance(data, dict):
                raise RequestError(refused("body", "not a JSON object", "a JSON object"))
            unknown = sorted(set(data) - FIELDS[kind])
            if unknown:
                raise RequestError(
                    refused(
                        shown(unknown[0], quote=False),
                        "not supported by this endpoint",
                        ", ".join(sorted(FIELDS[kind])),
                    )
                )
            request, n, stream, usage = self._request(kind, data)
            deadline = started + self.service.request_timeout
            if stream:
                return self._stream(kind, request, deadline, usage)
            futures = [self.service.batcher.submit(self._seeded(request, i), deadline=deadline) for i in range(n)]
        except RequestError as exc:
            return error(exc.status, str(exc), str(exc).split(":", 1)[0])
        try:
            results = [ScoringService.await_answer(f, deadline, client_gone) for f in futures]
        except TimeoutError:
            return error(503, f"no answer within {self.service.request_timeout:g} s: the endpoint is overloaded")
        except Exception:  # the model failed: logged by the service's logger, a plain message to the client
            log.exception("generation failed")
            return error(500, "the model failed on this request; see the endpoint log")
        answered = [r for r in results if r is not None]
        if len(answered) < len(results):
            return error(499, "the client closed the connection before the answer")
        return 200, self._completion(kind, answered)

    # --- requests -------------------------------------------------------------------------------------------------

    def _request(self, kind: str, data: dict) -> tuple[GenerateRequest, int, bool, bool]:
        model = data.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError(refused("model", f"{shown(model)} is not allowed", f"a model name ({self.model!r})"))
        stream = data.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(refused("stream", f"{shown(stream)} is not allowed", "true or false"))
        options = data.get("stream_options") or {}
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise RequestError(
                refused("stream_options", f"{shown(options)} is not allowed", '{"include_usage": true or false}')
            )
        n = _integer(data, "n", 1, 1, 1 if stream else MAX_N)
        stops = _stops(data)
        context = self.service.runtime.block_size
        if kind == "chat":
            ids = self._prompt_ids(_messages(data))
            prompt, stops = b"", stops + self.turn_end
            limit_name = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
            default = min(MAX_NEW_TOKENS, max(1, context - len(ids)))
        else:
            text = data.get("prompt")
            if isinstance(text, list) and len(text) == 1:
                text = text[0]
            if not isinstance(text, str) or not text:
                raise RequestError(refused("prompt", f"{shown(text)} is not allowed", "a non-empty string"))
            prompt, ids, limit_name, default = text.encode("utf-8", "replace"), None, "max_tokens", 16
        request = GenerateRequest(
            prompt=prompt,
            prompt_ids=tuple(ids) if ids is not None else None,
            max_new_tokens=_integer(data, limit_name, default, 1, MAX_NEW_TOKENS),
            temperature=_number(data, "temperature", 1.0, 0.0, MAX_TEMPERATURE),
            top_k=0,
            top_p=_number(data, "top_p", 1.0, 0.0, 1.0) or 1e-9,  # 0: the most probable token only
            seed=_integer(data, "seed", None, 0, 2**63 - 1),
            stop=stops,
            stop_ids=self.turn_end_ids if kind == "chat" else frozenset(),
        )
        return request, n, stream, bool(options.get("include_usage"))

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        """The chat's prompt as the model's template renders it: a conversation the template refuses is the
        client's 400; a template out of its budget (toolkit.data.template_process) the endpoint's 500, logged in a
        line, its renderer started afresh for the next request."""
        from toolkit.data.documents import DataFormatError
        from toolkit.data.template_process import TemplateBudgetError

        try:
            return self.template.prompt_ids(messages, "the conversation")
        except DataFormatError as exc:
            raise RequestError("messages: " + str(exc).removeprefix("data: ")) from None
        except TemplateBudgetError as exc:
            log.error("%s", exc)
            raise RequestError(f"messages: {exc}", 500) from None

    @staticmethod
    def _seeded(request: GenerateRequest, i: int) -> GenerateRequest:
        """The i-th of n choices: its own seed (the request's plus i), so the choices differ and repeat."""
        if i == 0 or request.seed is None:
            return request
        return replace(request, seed=request.seed + i)

    def _unauthorised(self, authorization: str | None) -> tuple[int, dict]:
        reason = "missing" if not authorization else "not valid"
        return error(401, refused("Authorization", f"key {reason}", "'Authorization: Bearer <endpoint key>'"))

    # --- answers --------------------------------------------------------------------------------------------------

    def _head(self, kind: str, chunk: bool = False) -> dict:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        obj = {"chat": "chat.completion", "completions": "text_completion"}[kind] + (".chunk" if chunk else "")
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()), "model": self.model}

    def _completion(self, kind: str, results: list[dict]) -> dict:
        choices = []
        for i, r in enumerate(results):
            if kind == "chat":
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": r["text"]},
                        "finish_reason": r["finish_reason"],
                        "logprobs": None,
                    }
                )
            else:
                choices.append({"index": i, "text": r["text"], "finish_reason": r["finish_reason"], "logprobs": None})
        prompt = results[0]["prompt_tokens"]
        completion = sum(r["new_tokens"] for r in results)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return {**self._head(kind), "choices": choices, "usage": usage}

    def _stream(self, kind: str, request: GenerateRequest, deadline: float, usage: bool) -> Iterator[bytes]:
        pieces: queue.Queue[str] = queue.Queue()
        future = self.service.batcher.submit(request, deadline=deadline, listener=pieces.put)  # may refuse: 400
        head = self._head(kind, chunk=True)

        def event(payload: dict | str) -> bytes:
            return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()

        def chunk(text: str | None, finish: str | None = None, role: bool = False) -> bytes:
            if kind == "chat":
                delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            return event({**head, "choices": [choice]})

        def events() -> Iterator[bytes]:
            try:
                if kind == "chat":
                    yield chunk(None, role=True)
                while True:
                    try:
                        yield chunk(pieces.get(timeout=STREAM_POLL_S))
                        continue
                    except queue.Empty:
                        pass
                    if future.done() and pieces.empty():
                        break
                    if time.perf_counter() > deadline:
                        future.cancel()
                        yield event(
                            {
                                "error": {
                                    "message": "no answer within the request deadline",
                                    "type": "server_error",
                                    "param": None,
                                    "code": None,
                                }
                            }
                        )
                        return
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - the stream has begun: the error is its last event
                    yield event(
                        {
                            "error": {
                                "message": f"generation failed ({type(exc).__name__})",
                                "type": "server_error",
                                "param": None,
                                "code": None,
                            }
                        }
                    )
                    return
                yield chunk(None, finish=result["finish_reason"])
                if usage:
                    tokens = result["prompt_tokens"], result["new_tokens"]
                    yield event(
                        {
                            **head,
                            "choices": [],
                            "usage": {
                                "prompt_tokens": tokens[0],
                                "completion_tokens": tokens[1],
                                "total_tokens": sum(tokens),
                            },
                        }
                    )
                yield event("[DONE]")
            finally:
                future.cancel()  # a client that went away mid-stream: its generation is dropped (done: no effect)

        return events()
