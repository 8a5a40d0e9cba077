"""Conversations: read in the shapes people keep them in, rendered by a chat template, with the assistant's tokens
marked as the ones the loss counts.

    ChatTemplate(tokenizer)                     the tokenizer's own chat_template, else ChatML (built in)
    template.tokens(messages, last_only, place) (ids, counted): the rendered conversation and, per token, whether
                                                it is an assistant token the loss counts

Shapes (data.chat), read by toolkit.data.documents (CHAT_SHAPES):
    messages   {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}, as OpenAI's API
               and transformers' apply_chat_template take them; an assistant turn may carry "tool_calls" (OpenAI's
               [{"type": "function", "function": {"name", "arguments"}}]) and a tool turn a "tool_call_id"
    sharegpt   {"conversations": [{"from": "system"|"human"|"gpt"|"tool", "value": "..."}, ...]}
    alpaca     {"instruction": "...", "input": "..." (optional), "output": "..."}: one user turn, one assistant turn

Which tokens count: the template is rendered once for the whole conversation and once up to each assistant turn
(with the generation prompt, and through the turn), so an assistant turn is the text between the two: its content
and the template's end-of-turn marker, which is how the model learns to stop. The whole text is tokenized once
(what the model sees at inference), and a token counts when it starts inside an assistant turn. A template whose
rendering of the first turns is not the start of its rendering of the whole conversation cannot be split this way
and is refused. Templates run in transformers' sandboxed Jinja environment: a template from a model folder cannot
reach files, imports or the network.
"""

from __future__ import annotations

import hashlib

import numpy as np

from toolkit.data.documents import DataFormatError
from toolkit.errors import refused

# ChatML (OpenAI's and Qwen's turn markers), for tokenizers without a chat_template: plain text markers, so it works
# for the byte tokenizer too. Tool calls are written as Hermes/Qwen do, one JSON object in <tool_call> tags.
CHATML = (  # newlines as expressions: transformers' Jinja environment trims the one after each block tag
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message.get('content') %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% if message.get('content') or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n' }}"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_STOP = "<|im_end|>"


class ChatTemplate:
    """A tokenizer's chat template (ChatML when it has none), rendering conversations into ids and loss masks."""

    def __init__(self, tokenizer):
        """``tokenizer``: a training tokenizer (toolkit.data.tokenizers) or an endpoint's (toolkit.deploy.hf_folder);
        both are the byte tokenizer or hold a transformers tokenizer as ``hf``."""
        from toolkit.data.tokenizers import ByteTokenizer

        hf = tokenizer.hf() if isinstance(tokenizer, ByteTokenizer) else tokenizer.hf
        own = getattr(hf, "chat_template", None)
        if isinstance(own, dict):  # several named templates: transformers' default is the one named "default"
            own = own.get("default")
        self.tokenizer, self.hf = tokenizer, hf
        self.source = (
            "the tokenizer's chat_template" if own else "ChatML (built in: the tokenizer has no chat_template)"
        )
        self.template: str = own or CHATML
        self.sha256 = hashlib.sha256(self.template.encode()).hexdigest()
        # a template from a folder renders in a process of its own, under a budget (toolkit.data.template_process)
        self.renderer = None
        if own:
            from toolkit.data.template_process import TemplateProcess

            folder = getattr(hf, "name_or_path", "") or getattr(tokenizer, "source", "") or "the tokenizer"
            self.renderer = TemplateProcess(own, _template_variables(hf), repr(str(folder)))

    def turn_end(self) -> str:
        """What the template writes after an assistant's text (ChatML: '<|im_end|>'), without surrounding
        whitespace: where a generated turn ends. Empty when the template writes nothing there."""
        mark = "\x00answer\x00"
        through = self.render([{"role": "user", "content": "?"}, {"role": "assistant", "content": mark}], "a probe")
        return through[through.index(mark) + len(mark) :].strip()

    def turn_end_id(self) -> int | None:
        """The id of :meth:`turn_end` when it is one special token (Zephyr's '<|end|>', Llama 3's '<|eot_id|>'),
        which a decoder that skips special tokens never shows as text; None otherwise."""
        end = self.turn_end()
        ids = self.hf(end, add_special_tokens=False)["input_ids"] if end else []
        return ids[0] if len(ids) == 1 and ids[0] in set(self.hf.all_special_ids) else None

    def prompt_ids(self, messages: list[dict], place: str) -> list[int]:
        """The ids of a conversation rendered to be answered (the template's generation prompt at its end), as
        training tokenized it: the template's own special tokens, none added."""
        return list(
            self.hf(self.render(messages, place, generation_prompt=True), add_special_tokens=False)["input_ids"]
        )

    def render(self, messages: list[dict], place: str, generation_prompt: bool = False) -> str:
        return self.render_all([(messages, generation_prompt)], place)[0]

    def render_all(self, jobs: list[tuple[list[dict], bool]], place: str) -> list[str]:
        """The texts of ``jobs`` ((messages, add_generation_prompt) each) as ``apply_chat_template(tokenize=False)``
        renders them: one round trip to the renderer process for a template from a folder. A conversation the
        template refuses is a DataFormatError naming ``place``; a template out of its budget a TemplateBudgetError
        naming its folder."""
        from toolkit.data.template_process import TemplateBudgetError, TemplateRenderError

        try:
            if self.renderer is not None:  # as apply_chat_template, which drops the keys whose value is None
                plain = [([{k: v for k, v in m.items() if v is not None} for m in ms], g) for ms, g in jobs]
                return self.renderer.render(plain)
            return [
                self.hf.apply_chat_template(
                    messages, chat_template=self.template, tokenize=False, add_generation_prompt=generation_prompt
                )
                for messages, generation_prompt in jobs
            ]
        except TemplateBudgetError:
            raise
        except TemplateRenderError as exc:
            problem = f"{exc.type_name}: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - a template raises what it likes (TemplateError, KeyError, ...)
            problem = f"{type(exc).__name__}: {exc}"
        raise DataFormatError(
            refused(
                "data",
                f"{place} does not render with {self.source} ({problem})",
                "conversations the template accepts (many require user and assistant turns to alternate)",
            )
        ) from None

    def close(self) -> None:
        """End the renderer process, if any (it also ends with this process)."""
        if self.renderer is not None:
            self.renderer.close()

    def assistant_spans(self, messages: list[dict], last_only: bool, place: str) -> tuple[str, list[tuple[int, int]]]:
        """(the rendered conversation, the character spans of its assistant turns: all, or the last one)."""
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        turns = turns[-1:] if last_only else turns
        # one round trip: the whole, then for each turn the conversation before it (prompted, when there is one)
        # and through it
        jobs = [(messages, False)]
        for i in turns:
            jobs += [(messages[:i], True)] if i else []
            jobs.append((messages[: i + 1], False))
        text, *prefixes = self.render_all(jobs, place)
        spans = []
        for i in turns:
            before = prefixes.pop(0) if i else ""
            through = prefixes.pop(0)
            if not (through.startswith(before) and text.startswith(through)):
                raise DataFormatError(
                    refused(
                        "data",
                        f"{place}: {self.source} renders the first turns differently from the whole conversation, so "
                        f"the assistant's tokens cannot be told apart",
                        "a template whose rendering of a conversation's first turns starts its rendering of the "
                        "whole, as most do (or none: ChatML is built in)",
                    )
                )
            spans.append((len(before), len(through)))
        return text, spans

    def tokens(self, messages: list[dict], last_only: bool, place: str) -> tuple[list[int], np.ndarray]:
        """(ids of the rendered conversation, 1 where a token counts for the loss)."""
        text, spans = self.assistant_spans(messages, last_only, place)
        ids, starts = self.tokenizer.encode_with_offsets(text)
        counted = np.zeros(len(ids), dtype=np.uint8)
        starts_arr = np.asarray(starts, dtype=np.int64)
        for begin, end in spans:
            counted[(starts_arr >= begin) & (starts_arr < end)] = 1
        return ids, counted


def _template_variables(hf) -> dict:
    """What apply_chat_template hands a template besides the conversation: the tokenizer's special tokens (bos_token,
    eos_token, ...), as text."""
    return {
        name: value if isinstance(value, (str, list)) else str(value)
        for name, value in getattr(hf, "special_tokens_map", {}).items()
    }
