"""Chat templates from elsewhere, rendered in a process of their own under a budget they cannot escape.

A chat template is a program (Jinja) that came with a tokenizer or model folder. transformers' sandbox keeps it
from files, imports and the network, but not from looping for hours or allocating gigabytes, and a thread cannot be
stopped from outside. So a template other than the built-in ChatML renders in a child process:

    renderer = TemplateProcess(template, variables, folder)   # the child starts on the first rendering
    texts = renderer.render([(messages, add_generation_prompt), ...])
    renderer.close()

Each call is one round trip (a conversation's renderings together). The child's address space is capped
(RLIMIT_AS: MEMORY_BYTES above what it holds once started); each call has TIME_S of wall-clock time, after which
the child is killed and the call refused with TemplateBudgetError naming the folder; the next call starts a new
child. A rendering longer than MAX_RENDERED_CHARS is refused too. The child renders with
transformers' own ``render_jinja_template``, as ``apply_chat_template`` does, so its text is transformers' to the
character. It ends with the process that started it (a pidfd watched by a thread), even while a template spins.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from toolkit.errors import UserError, refused
from toolkit.paths import SAFE_PATH_ENV
from toolkit.parent_watch import parent_env, when_parent_exits

TIME_S = 5.0  # per call: a conversation renders in milliseconds
START_S = 60.0  # the renderer's start-up (imports), apart from any budget: a busy machine may be slow to start it
MEMORY_BYTES = 1 << 30  # address space a template may add; a conversation's rendering needs kilobytes
MAX_RENDERED_CHARS = 16 << 20  # one rendering; longer is a template multiplying its input


class TemplateBudgetError(UserError, RuntimeError):
    """A template ran out of its time or memory, or its process ended; the message names the template's folder."""


class TemplateRenderError(Exception):
    """The template refused or failed on one conversation (what it raised, as ``type`` and ``message``)."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message = type_name, message


class TemplateProcess:
    """One template's renderer process; thread-safe (one call at a time)."""

    def __init__(self, template: str, variables: dict, folder: str, time_s: float = TIME_S):
        self.setup = {"template": template, "variables": variables, "memory": MEMORY_BYTES}
        self.folder, self.time_s = folder, time_s
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.owner = os.getpid()  # a forked copy of this object (a DataLoader worker's) never kills the renderer

    def render(self, jobs: list[tuple[list[dict], bool]]) -> list[str]:
        """The texts of ``jobs`` ((messages, add_generation_prompt) each), or TemplateRenderError for the first the
        template refused, or TemplateBudgetError when the call runs out of time (``time_s``) or memory."""
        with self.lock:
            process = self._started()
            ends = time.monotonic() + self.time_s
            assert process.stdin is not None and process.stdout is not None  # both are pipes
            try:
                process.stdin.write(json.dumps({"jobs": jobs}).encode() + b"\n")
                process.stdin.flush()
                line = self._answer(process, ends)
            except BrokenPipeError:
                line = b""
            except BaseException:  # a signal's exception mid-call: the child's answer would be read by the next call
                self._kill()
                raise
            if not line:
                code = self._kill()
                raise self._budget(f"its process ended ({_described_exit(code)})")
            answer = json.loads(line)
            if "error" in answer:
                kind, message = answer["error"]
                if kind == "budget":
                    raise self._budget(message)
                raise TemplateRenderError(kind, message)
            return answer["texts"]

    def _answer(self, process: subprocess.Popen, ends: float) -> bytes:
        """The child's answer line, read by chunks until its newline; at ``ends`` the child is killed."""
        chunks = []
        assert process.stdout is not None
        fd = process.stdout.fileno()
        while True:
            left = ends - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self._kill()
                raise self._budget(f"took longer than {self.time_s:g} s")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                return b"".join(chunks)

    def _budget(self, problem: str) -> TemplateBudgetError:
        return TemplateBudgetError(
            refused(
                "chat template",
                f"the chat template of {self.folder} {problem}",
                f"a template that renders a conversation within {self.time_s:g} s and {MEMORY_BYTES >> 20:,} MiB",
            )
        )

    def _started(self) -> subprocess.Popen:
        """The renderer, started when there is none: its start-up (imports, on a machine that may be busy) is
        awaited up to START_S, outside any conversation's budget."""
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "toolkit.data.template_process"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, **SAFE_PATH_ENV, **parent_env()},  # no import from the cwd
            )
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(self.setup).encode() + b"\n")
            self.process.stdin.flush()
            try:
                ready = self._answer(self.process, time.monotonic() + START_S)
            except TemplateBudgetError:
                ready = b""
            if ready != b"ready\n":
                code = self._kill()
                raise self._budget(f"could not start its renderer in {START_S:g} s ({_described_exit(code)})")
        return self.process

    def _kill(self) -> int | None:
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        code = process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        return code

    def close(self) -> None:
        with self.lock:
            self._kill()

    def __del__(self):
        if self.owner == os.getpid() and self.process is not None and self.process.poll() is None:
            self.process.kill()


def _described_exit(code: int | None) -> str:
    if code is None:
        return "stopped"
    return signal.Signals(-code).name if code < 0 else f"exit status {code}"


# --- the child ---------------------------------------------------------------------------------------------------


def _cap_memory(extra: int) -> None:
    """Address space: what the process holds now, plus ``extra``."""
    with open("/proc/self/statm") as f:
        held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (held + extra, held + extra))


def _serve() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    when_parent_exits(lambda: os._exit(1))  # a template that spins never reads its closed stdin
    setup = json.loads(sys.stdin.buffer.readline())
    template, variables = setup["template"], setup["variables"]
    _cap_memory(setup["memory"])  # before the template runs at all
    out = sys.stdout.buffer
    out.write(b"ready\n")  # each conversation's budget starts from here
    out.flush()
    for line in sys.stdin.buffer:
        try:
            texts = []
            jobs: list = json.loads(line)["jobs"]
            for messages, generation_prompt in jobs:
                # (texts, generation indices), whatever transformers' annotation says
                rendered: Any = render_jinja_template(
                    conversations=[messages],
                    chat_template=template,
                    add_generation_prompt=generation_prompt,
                    **variables,
                )
                if len(rendered[0][0]) > MAX_RENDERED_CHARS:
                    raise _Budget(f"rendered over {MAX_RENDERED_CHARS:,} characters")
                texts.append(rendered[0][0])
            answer = {"texts": texts}
        except MemoryError:
            answer = {"error": ["budget", f"needed more than {MEMORY_BYTES >> 20:,} MiB"]}
        except _Budget as exc:
            answer = {"error": ["budget", str(exc)]}
        except Exception as exc:  # noqa: BLE001 - a template raises what it likes (TemplateError, KeyError, ...)
            answer = {"error": [type(exc).__name__, str(exc)]}
        try:
            out.write(json.dumps(answer).encode() + b"\n")
        except MemoryError:
            out.write(json.dumps({"error": ["budget", "its rendering is too large to send"]}).encode() + b"\n")
        out.flush()


class _Budget(Exception):
    pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the starter's to handle; it kills this process
    _serve()
