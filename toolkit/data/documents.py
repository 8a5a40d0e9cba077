"""What a data file holds, before any tokenizer: documents (plain text, JSON Lines with a text field), instruction
examples (prompt and completion fields), conversations (toolkit.data.chat) or labelled examples (text and label).
Parsing only: no torch, no files opened here, every bad line refused with its file and line number.

    data_format(cfg)                        which of the three a run trains on, and the fields it reads
    file_records(name, data, fmt, where)    one file's documents or examples
    table_records(frame, fmt, where)        an MLTable's labelled examples
    label_ids(labels, ...)                  class ids for integer labels, or for class names in sorted order

A file is JSON Lines when its name ends in .jsonl (in a uri_file or uri_folder asset, or at data.path); any other
file is one plain-text document.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from toolkit.errors import UserError, bounded_repr, refused
from toolkit.plain_data import MAX_DEPTH, PlainDataError, check_plain

SEPARATOR = b"\n\n"  # between two documents, for a tokenizer without an end-of-text token (bytes)
FORMAT_VERSION = 1  # part of every cache tag: a change to what a token file holds gets new files
MODES = ("text", "instruction", "chat", "labelled", "preference")


class DataFormatError(UserError, ValueError):
    """Data that cannot be read as the config says (a bad JSON line, a missing field or column, a mixed label);
    the message names the file and line (or row) and what is allowed."""


@dataclass(frozen=True)
class DataFormat:
    mode: str  # text: documents to pack; instruction: prompt/completion pairs; chat: conversations; labelled: text;
    # preference: prompts, each with a chosen and a rejected answer
    text_field: str = ""
    prompt_field: str = ""
    completion_field: str = ""
    label_field: str = ""
    chat: str = ""  # chat: the shape conversations are kept in (toolkit.data.chat.SHAPES); preference: 'messages'
    # when prompts are lists of turns
    assistant_loss: str = ""  # chat: 'all' assistant turns count for the loss, or the 'last'
    template_sha256: str = ""  # chat: the chat template's hash, set once the tokenizer is known

    def tag(self, has_jsonl: bool) -> str:
        """This format's part of a token file's name: empty for plain text (so byte-level text keeps its name),
        else a short hash of the mode and the fields read."""
        if self.mode == "text" and not has_jsonl:
            return ""
        described = json.dumps({"v": FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return "-" + hashlib.sha256(described.encode()).hexdigest()[:12]

    def allowed(self) -> str:
        """What a JSON Lines line must be, for messages."""
        if self.mode == "chat":
            return chat_allowed(self.chat)
        if self.mode == "preference":
            return preference_allowed(self.chat)
        if self.mode == "instruction":
            return (
                f"one JSON object per line with string fields {self.prompt_field!r} (data.prompt_field) and "
                f"{self.completion_field!r} (data.completion_field)"
            )
        if self.mode == "labelled":
            return (
                f"one JSON object per line with a string field {self.text_field!r} (data.text_field) and a label "
                f"{self.label_field!r} (data.label_field): a class number (0, 1, ...) or a class name"
            )
        return f"one JSON object per line with a string field {self.text_field!r} (data.text_field)"


def data_format(cfg) -> DataFormat:
    """The format a config reads its text data as: labelled for a sequence classifier, preference pairs for DPO,
    conversations when data.chat is set, instruction when data.prompt_field is, else documents."""
    data = cfg.data
    if cfg.model.name == "hf" and cfg.model.hf.task == "sequence_classification":
        return DataFormat("labelled", text_field=data.text_field, label_field=data.label_field)
    if cfg.train.objective == "dpo":
        return DataFormat("preference", chat=data.chat)
    if data.chat:
        return DataFormat("chat", chat=data.chat, assistant_loss=data.assistant_loss)
    if data.prompt_field:
        return DataFormat("instruction", prompt_field=data.prompt_field, completion_field=data.completion_field)
    return DataFormat("text", text_field=data.text_field)


def is_jsonl(name: str) -> bool:
    return name.lower().endswith(".jsonl")


def jsonl_objects(lines: Iterable[tuple[int, bytes]], where: str, fmt: DataFormat) -> Iterator[tuple[int, dict]]:
    """(line number, object) of every non-blank one of ``lines`` (numbered); a line that is not UTF-8 JSON or not an
    object is refused."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)  # RecursionError below, not plain_data.loads_json: this names the line
        except UnicodeDecodeError:
            raise DataFormatError(refused("data", f"line {number} of {where} is not UTF-8", fmt.allowed())) from None
        except json.JSONDecodeError as exc:
            raise DataFormatError(
                refused(
                    "data", f"line {number} of {where} is not JSON ({exc.msg} at column {exc.colno})", fmt.allowed()
                )
            ) from None
        except RecursionError:  # json's decoder gives up at about sys.getrecursionlimit() levels
            raise DataFormatError(
                refused("data", f"line {number} of {where} is JSON nested too deeply to read", fmt.allowed())
            ) from None
        if not isinstance(value, dict):
            raise DataFormatError(
                refused("data", f"line {number} of {where} is {bounded_repr(value)}, not a JSON object", fmt.allowed())
            )
        yield number, value


def _string(obj: dict, field: str, number: int, where: str, fmt: DataFormat) -> str:
    value = obj.get(field)
    if not isinstance(value, str):
        problem = "has no field" if field not in obj else f"has {bounded_repr(value)}, not a string, in field"
        raise DataFormatError(refused("data", f"line {number} of {where} {problem} {field!r}", fmt.allowed()))
    return value


def label_value(value, field: str, place: str, allowed: str):
    """A label as given: a class number (int >= 0) or a class name (non-empty string)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value:
        return value
    problem = "has no label" if value is None else f"has label {bounded_repr(value)}"
    raise DataFormatError(refused("data", f"{place} {problem} in {field!r}", allowed))


def file_records(name: str, data: bytes, fmt: DataFormat, where: str) -> list:
    """One file's records: text mode, documents (a plain file is one, bytes as read; a .jsonl file one per line);
    instruction mode, (prompt, completion) pairs; chat mode, (messages, line number); labelled mode, (text, label,
    line number); preference mode, (prompt, chosen, rejected, line number). ``where`` names the file in
    messages (e.g. "'train.jsonl' of qa:1")."""
    if not is_jsonl(name):
        if fmt.mode != "text":
            kind = fmt.mode
            raise DataFormatError(
                refused(
                    "data",
                    f"{where} is not JSON Lines (its name does not end in .jsonl)",
                    f"{kind} data as .jsonl files: {fmt.allowed()}"
                    + (", or an MLTable" if fmt.mode == "labelled" else ""),
                )
            )
        return [data]
    return line_records(enumerate(data.split(b"\n"), start=1), fmt, where)


def line_records(lines: Iterable[tuple[int, bytes]], fmt: DataFormat, where: str) -> list:
    """The records of numbered JSON Lines (a whole file's, or a run of them as a streaming reader hands them over:
    toolkit.data.sources), as :func:`file_records` gives them."""
    records = []
    if fmt.mode == "chat":
        read = CHAT_SHAPES[fmt.chat]
        return [(read(obj, f"line {number} of {where}"), number) for number, obj in jsonl_objects(lines, where, fmt)]
    if fmt.mode == "preference":
        return [
            preference_pair(obj, fmt.chat, f"line {number} of {where}")
            for number, obj in jsonl_objects(lines, where, fmt)
        ]
    for number, obj in jsonl_objects(lines, where, fmt):
        if fmt.mode == "text":
            records.append(_string(obj, fmt.text_field, number, where, fmt))
        elif fmt.mode == "instruction":
            prompt = _string(obj, fmt.prompt_field, number, where, fmt)
            completion = _string(obj, fmt.completion_field, number, where, fmt)
            if not prompt and not completion:
                raise DataFormatError(
                    refused(
                        "data",
                        f"line {number} of {where} has an empty prompt and an empty completion: nothing to learn from",
                        fmt.allowed(),
                    )
                )
            records.append((prompt, completion))
        else:
            text = _string(obj, fmt.text_field, number, where, fmt)
            records.append(
                (
                    text,
                    label_value(obj.get(fmt.label_field), fmt.label_field, f"line {number} of {where}", fmt.allowed()),
                    number,
                )
            )
    return records


def table_records(frame, fmt: DataFormat, where: str) -> list[tuple[str, object, int]]:
    """An MLTable's (text, label, row number) rows; ``where`` names the table. Rows are numbered from 1 (the header
    not counted)."""
    allowed = (
        f"a table with a text column {fmt.text_field!r} (data.text_field) and a label column "
        f"{fmt.label_field!r} (data.label_field)"
    )
    missing = [c for c in (fmt.text_field, fmt.label_field) if c not in frame.columns]
    if missing:
        raise DataFormatError(
            refused(
                "data",
                f"{where} has no column {missing[0]!r} (its columns: {', '.join(map(str, frame.columns))})",
                allowed,
            )
        )
    records = []
    for row, (text, label) in enumerate(zip(frame[fmt.text_field].tolist(), frame[fmt.label_field].tolist()), 1):
        if not isinstance(text, str):
            raise DataFormatError(
                refused(
                    "data", f"row {row} of {where} has {bounded_repr(text)}, not text, in {fmt.text_field!r}", allowed
                )
            )
        if isinstance(label, float) and label.is_integer():  # pandas reads an int column with gaps as floats
            label = int(label)
        records.append(
            (
                text,
                label_value(label if label == label else None, fmt.label_field, f"row {row} of {where}", allowed),
                row,
            )
        )
    return records


def label_ids(labels: list) -> tuple[np.ndarray, list[str] | None]:
    """(class ids, class names): integer labels are the ids (names None); string labels are numbered in sorted
    order (names: that order). ``labels`` must be all of one kind (:class:`LabelKinds` checks as they are read)."""
    if not labels or not isinstance(labels[0], str):
        return np.asarray(labels, dtype=np.int64), None
    names = sorted(set(labels))
    index = {name: i for i, name in enumerate(names)}
    return np.asarray([index[label] for label in labels], dtype=np.int64), names


class LabelKinds:
    """Remembers where the first number and the first name label were seen, to refuse data that mixes them."""

    def __init__(self):
        self.first: dict[type, str] = {}

    def see(self, label, number: int, where: str, unit: str = "line") -> None:
        kind = str if isinstance(label, str) else int
        if kind not in self.first:
            self.first[kind] = f"{unit} {number} of {where}"
        if len(self.first) == 2:
            raise DataFormatError(
                refused(
                    "data",
                    f"labels mix class numbers (first at {self.first[int]}) and class names (first at "
                    f"{self.first[str]})",
                    "all labels numbers (0, 1, ...) or all names",
                )
            )


# --- conversations (data.chat): each shape read into OpenAI-style messages, checked ------------------------------

ROLES = ("system", "user", "assistant", "tool")


def chat_allowed(shape: str) -> str:
    """What a line of ``shape`` must be, for messages."""
    return {
        "messages": 'one JSON object per line with "messages": a list of {"role": one of system, user, assistant, '
        'tool; "content": text}, with at least one assistant turn (data.chat=messages)',
        "sharegpt": 'one JSON object per line with "conversations": a list of {"from": one of system, human, gpt, '
        'tool; "value": text}, with at least one gpt turn (data.chat=sharegpt)',
        "alpaca": 'one JSON object per line with text fields "instruction" and "output", and optionally "input" '
        "(data.chat=alpaca)",
    }[shape]


def _refuse(shape: str, place: str, problem: str) -> DataFormatError:
    return DataFormatError(refused("data", f"{place} {problem}", chat_allowed(shape)))


def _tool_calls(calls, shape: str, place: str, turn: int) -> list[dict]:
    if not isinstance(calls, list) or not calls:
        raise _refuse(shape, place, f"has tool_calls {bounded_repr(calls)} in turn {turn}, not a non-empty list")
    checked = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            raise _refuse(shape, place, f"has a tool call {bounded_repr(call)} in turn {turn} without a function name")
        try:
            arguments = tool_call_arguments(function.get("arguments", {}))
        except PlainDataError as exc:
            problem = f"has a tool call {name!r} in turn {turn} that cannot be rendered ({exc})"
            raise _refuse(shape, place, problem) from None
        checked.append(template_tool_call(call, name, arguments))
    return checked


def tool_call_arguments(arguments):
    """A tool call's arguments as chat templates take them (transformers' convention: an object). OpenAI sends a
    JSON string, parsed here; text that is not JSON is rendered as the text it is. Raises PlainDataError when they
    nest deeper than plain_data.MAX_DEPTH or hold what JSON cannot write: a template's ``tojson`` recurses through
    them, and json's parser through the string."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
        except RecursionError:
            raise PlainDataError(f"arguments: nested deeper than {MAX_DEPTH} levels") from None
    check_plain(arguments, "arguments")
    return arguments


def template_tool_call(call: dict, name: str, arguments) -> dict:
    """A checked tool call as a template sees it: its id (when given), type and function, nothing else of the
    object it came in."""
    kept = {"id": call["id"]} if isinstance(call.get("id"), str) else {}
    return {**kept, "type": call.get("type", "function"), "function": {"name": name, "arguments": arguments}}


def check_messages(messages, shape: str, place: str, answered: bool = True) -> list[dict]:
    """``messages`` checked: a list of turns with known roles and text content, assistant turns not empty, and (when
    ``answered``) at least one assistant turn, else there is nothing to learn from."""
    if not isinstance(messages, list) or not messages:
        raise _refuse(shape, place, f"has {bounded_repr(messages)}, not a non-empty list of turns")
    checked = []
    for turn, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            raise _refuse(shape, place, f"has turn {turn} {bounded_repr(message)}, not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _refuse(shape, place, f"has role {bounded_repr(role)} in turn {turn}, not one of {', '.join(ROLES)}")
        if content is not None and not isinstance(content, str):
            raise _refuse(shape, place, f"has content {bounded_repr(content)} in turn {turn}, not text")
        turn_out = {"role": role, "content": content or ""}
        if role == "assistant" and message.get("tool_calls") is not None:
            turn_out["tool_calls"] = _tool_calls(message["tool_calls"], shape, place, turn)
        elif role == "assistant" and not (content or "").strip():
            raise _refuse(shape, place, f"has an empty assistant turn (turn {turn}): nothing to learn from")
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            turn_out["tool_call_id"] = message["tool_call_id"]
        checked.append(turn_out)
    if answered and not any(m["role"] == "assistant" for m in checked):
        raise _refuse(shape, place, "has no assistant turn: nothing to learn from")
    return checked


def _messages(obj: dict, place: str) -> list[dict]:
    if "messages" not in obj:
        raise _refuse("messages", place, "has no field 'messages'")
    return check_messages(obj["messages"], "messages", place)


SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function_call": "assistant",
    "observation": "tool",
}


def _sharegpt(obj: dict, place: str) -> list[dict]:
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise _refuse("sharegpt", place, f"has {bounded_repr(turns)} in 'conversations', not a non-empty list")
    messages = []
    for turn, item in enumerate(turns, start=1):
        speaker = item.get("from") if isinstance(item, dict) else None
        if speaker not in SHAREGPT_ROLES:
            raise _refuse(
                "sharegpt",
                place,
                f"has 'from' {bounded_repr(speaker)} in turn {turn}, not one of system, human, gpt, tool",
            )
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": item.get("value")})
    return check_messages(messages, "sharegpt", place)


def _alpaca(obj: dict, place: str) -> list[dict]:
    for field in ("instruction", "output"):
        if not isinstance(obj.get(field), str):
            raise _refuse("alpaca", place, f"has {bounded_repr(obj.get(field))} in {field!r}, not text")
    extra = obj.get("input") or ""
    if not isinstance(extra, str):
        raise _refuse("alpaca", place, f"has {bounded_repr(extra)} in 'input', not text")
    prompt = obj["instruction"] + ("\n\n" + extra if extra.strip() else "")
    return check_messages(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": obj["output"]}], "alpaca", place
    )


CHAT_SHAPES: dict[str, Callable[[dict, str], list[dict]]] = {
    "messages": _messages,
    "sharegpt": _sharegpt,
    "alpaca": _alpaca,
}


# --- preference pairs (train.objective=dpo) -----------------------------------------------------------------------


def preference_allowed(chat: str) -> str:
    """What a line of preference pairs must be, for messages."""
    prompt = (
        'a list of turns ({"role": system, user, assistant or tool; "content": text}) ending where the answer starts'
        if chat
        else "text"
    )
    return (
        f'one JSON object per line with "prompt": {prompt}; "chosen" and "rejected": two different answers to it, each '
        'text or a list of one assistant turn (train.objective=dpo)'
    )


def _answer(value, field: str, chat: str, place: str) -> str:
    """A chosen or rejected answer's text: a string, or (TRL's conversational shape) a list of one assistant turn."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        if value[0].get("role") == "assistant":
            value = value[0].get("content")
    if not isinstance(value, str) or not value.strip():
        problem = "has no field" if value is None else f"has {bounded_repr(value)}, not a non-empty answer, in field"
        raise DataFormatError(refused("data", f"{place} {problem} {field!r}", preference_allowed(chat)))
    return value


def preference_pair(obj: dict, chat: str, place: str) -> tuple:
    """(prompt, chosen, rejected, place) from one line: the prompt text, or its checked turns with ``chat``;
    refused when an answer is missing or empty, or when chosen and rejected are the same (nothing to prefer)."""
    allowed = preference_allowed(chat)
    if chat:
        if not isinstance(obj.get("prompt"), list):
            raise DataFormatError(
                refused(
                    "data", f"{place} has {bounded_repr(obj.get('prompt'))} in 'prompt', not a list of turns", allowed
                )
            )
        prompt = check_messages(obj["prompt"], "messages", place, answered=False)
        if prompt[-1]["role"] == "assistant":
            raise DataFormatError(
                refused(
                    "data",
                    f"{place} has a 'prompt' that ends with an assistant turn (turn {len(prompt)}), where the answer "
                    "starts",
                    allowed,
                )
            )
    else:
        prompt = obj.get("prompt")
        if not isinstance(prompt, str):
            raise DataFormatError(refused("data", f"{place} has {bounded_repr(prompt)} in 'prompt', not text", allowed))
    chosen, rejected = (_answer(obj.get(field), field, chat, place) for field in ("chosen", "rejected"))
    if chosen == rejected:
        raise DataFormatError(
            refused("data", f"{place} has the same text in 'chosen' and 'rejected': nothing to prefer", allowed)
        )
    return prompt, chosen, rejected, place
