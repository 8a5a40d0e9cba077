"""What a fine-tune changed, in figures and in words: the held-out loss before and after, and a few held-out prompts
answered by both models side by side (``trainbook evaluate RUN``; notebook 06).

    result = evaluate_run("runs/chat-lora-...")       # the run's newest checkpoint against the weights it started from
    print(result.text()); HTML(result.html())

"Before" is the model the run started from, built as training built it (the seed, model.init_from or
model.hf.source; with LoRA, the base with its adapters at zero, which is the base); "after" is the newest valid
checkpoint (toolkit.deploy.export.load_trained_model, both engines). The held-out loss is the model's own loss over
the run's fixed validation batches, the ones every evaluation of the run used: on conversations it counts the
assistant's tokens only, on instruction pairs the completions; after a DPO run, the chosen and the rejected answers
are scored apart (DPO should lower the second relative to the first). The answers are greedy, cut at the end of a
turn (the chat template's end marker, or the tokenizer's end of text).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.errors import RefusedValue, not_allowed
from toolkit.tables import Column, html_table, text_table


@dataclass(frozen=True)
class Score:
    """One held-out figure before and after."""

    name: str
    before: float
    after: float


@dataclass(frozen=True)
class Sample:
    """One held-out prompt, the answer the data holds for it, and each model's."""

    prompt: str
    expected: str
    before: str
    after: str


SCORE_COLUMNS = [
    Column("held out", "name"),
    Column("before", "before", ".4f", True),
    Column("after", "after", ".4f", True),
]


@dataclass
class Evaluation:
    run: str
    checkpoint: str
    step: int
    data: str
    scores: list[Score] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = [
            f"{self.run}: {self.checkpoint} (step {self.step}) against the weights it started from, on {self.data}"
        ]
        lines += ["", text_table(self.scores, SCORE_COLUMNS)]
        for i, s in enumerate(self.samples, 1):
            lines += ["", f"example {i}"]
            for label, value in (
                ("prompt", s.prompt),
                ("expected", s.expected),
                ("before", s.before),
                ("after", s.after),
            ):
                lines.append(f"  {label:<9}{_one_line(value)}")
        return "\n".join(lines)

    def html(self) -> str:
        scores = html_table(
            self.scores,
            SCORE_COLUMNS,
            caption=f"{self.checkpoint} (step {self.step}) against its starting weights, on {self.data}",
        )
        if not self.samples:
            return scores
        samples = html_table(
            self.samples,
            [
                Column("prompt", lambda s: _one_line(s.prompt)),
                Column("expected", "expected"),
                Column("before", "before"),
                Column("after", "after"),
            ],
            caption="held-out prompts answered (greedy)",
        )
        return scores + samples


def _one_line(text: str, limit: int = 160) -> str:
    """A prompt or answer on one line: newlines shown as a return symbol, a long one cut at its start."""
    shown = text.replace("\n", "\u23ce")
    return shown if len(shown) <= limit else "\u2026" + shown[-limit + 1 :]


def evaluate_run(
    run_dir: str | Path, examples: int = 3, max_new_tokens: int = 48, trust_run: bool = False
) -> Evaluation:
    """The run's newest checkpoint against the weights it started from (see the module's docstring): the held-out
    scores, and ``examples`` held-out prompts answered by both with at most ``max_new_tokens`` tokens each."""
    from toolkit import trust
    from toolkit.config import is_causal_lm
    from toolkit.data.corpus import load_corpus, val_batches
    from toolkit.deploy.export import load_trained_model
    from toolkit.rundir import RunDir
    from toolkit.train.models import prepare_model

    for name, value, least in (("examples", examples, 0), ("max_new_tokens", max_new_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_TOKENS:
            raise RefusedValue(not_allowed(name, value, f"a whole number from {least} to {MAX_TOKENS}"))
    run = RunDir(run_dir)
    if run.config_path.exists():  # what evaluating acts on (the model's source, the data's workspace) is vouched for
        trust.require(run.path, run.read_config(), "evaluate", trust_run)
    after, cfg, info = load_trained_model(run_dir, trust_run=trust_run)
    before = prepare_model(cfg, pretrained=True)[0].float().eval()
    corpus = load_corpus(cfg)
    scores = _scores(cfg, corpus, before, after, val_batches(corpus, cfg, 0, 1))
    samples = []
    if examples and is_causal_lm(cfg.model):
        answer = Greedy(cfg, max_new_tokens)
        samples = [
            Sample(prompt, answer.cut(expected), answer(before, ids), answer(after, ids))
            for prompt, expected, ids in _prompts(cfg, corpus, examples, answer.tokenizer, max_new_tokens)
        ]
    return Evaluation(
        run=Path(run_dir).name,
        checkpoint=info.name,
        step=int(info.manifest["trainer"]["step"]),
        data=f"the validation split of {corpus.name} ({cfg.train.eval_batches} batches of "
        f"{cfg.train.batch_size * cfg.train.grad_accum_steps})",
        scores=scores,
        samples=samples,
    )


MAX_TOKENS = 512  # examples and max_new_tokens at most: an evaluation is for reading


def _scores(cfg, corpus, before, after, batches) -> list[Score]:
    """Both models' mean loss over ``batches`` (bits per byte too where the data is text); a preference batch's two
    halves scored apart."""
    import torch

    from toolkit.data.batch import CHOSEN, REJECTED, half
    from toolkit.data.corpus import bits_per_byte
    from toolkit.train.models import loss_function

    loss_fn = loss_function(cfg.model)
    if corpus.pairs:
        parts = {
            "loss on the chosen answers": lambda batch: half(batch, CHOSEN),
            "loss on the rejected answers": lambda batch: half(batch, REJECTED),
        }
    else:
        parts = {"loss": lambda batch: batch}
    sums = {name: [0.0, 0.0] for name in parts}
    count = 0
    with torch.no_grad():
        for batch in batches:
            count += 1
            for name, part in parts.items():
                for i, model in enumerate((before, after)):
                    sums[name][i] += float(loss_fn(model, part(batch)))
    scores = [
        Score(name, total_before / count, total_after / count) for name, (total_before, total_after) in sums.items()
    ]
    bpb = [None] if corpus.pairs else [bits_per_byte(s, corpus) for s in (scores[0].before, scores[0].after)]
    if None not in bpb:  # text data: the same figure in bits per byte
        scores.append(Score("bits per byte", *bpb))
    return scores


def _prompts(cfg, corpus, count: int, tokenizer, max_new_tokens: int) -> list[tuple[str, str, list[int]]]:
    """(prompt, expected answer, prompt ids) of the first ``count`` held-out examples: an example's tokens up to
    its first counted one (the prompt, its end kept when it is long) and that counted run (the answer; a pair's
    chosen one). For documents: the first half of a validation row, and the rest of it."""
    import numpy as np

    # the prompt's tokens kept: what leaves room for the answer in the context, and at least half of it
    room = max(cfg.model.block_size // 2, cfg.model.block_size - max_new_tokens)
    found = []
    if not hasattr(corpus, "starts"):  # documents
        from toolkit.data.corpus import val_batch

        for row in val_batch(corpus, cfg, 0)["input_ids"][:count].tolist():
            cut = min(room, len(row) // 2)
            found.append((tokenizer.decode(row[:cut]), tokenizer.decode(row[cut:]), row[:cut]))
        return found
    for i in corpus.splits["val"][:count].tolist():
        example = 2 * i if corpus.pairs else i
        begin, end = int(corpus.starts[example]), int(corpus.starts[example + 1])
        counted = np.asarray(corpus.mask[begin:end]) == 1
        first = int(np.argmax(counted))  # where the answer starts
        length = int(np.argmin(counted[first:])) or len(counted) - first  # its counted run
        prompt = corpus.tokens[max(begin, begin + first - room) : begin + first].tolist()
        answer = corpus.tokens[begin + first : begin + first + length].tolist()
        found.append((tokenizer.decode(prompt), tokenizer.decode(answer), prompt))
    return found


class Greedy:
    """Greedy answers from a model for a run's config: at most ``max_new_tokens`` tokens, cut where a turn ends (the
    chat template's end marker for conversations; else the tokenizer's end of text, or for bytes the blank line that
    ends an example)."""

    def __init__(self, cfg, max_new_tokens: int):
        from toolkit.data.documents import SEPARATOR, data_format
        from toolkit.data.tokenizers import load_tokenizer
        from toolkit.train.models import logits_function

        self.tokenizer = load_tokenizer(cfg)
        self.logits_fn, self.block_size, self.max_new_tokens = (
            logits_function(cfg.model),
            cfg.model.block_size,
            max_new_tokens,
        )
        self.eos_id = self.tokenizer.eos_id
        if data_format(cfg).chat:
            from toolkit.data.chat import ChatTemplate

            self.stop = ChatTemplate(self.tokenizer).turn_end() or SEPARATOR.decode()
        else:
            self.stop = self.tokenizer.decode([self.eos_id]) if self.eos_id is not None else SEPARATOR.decode()

    def cut(self, text: str) -> str:
        """``text`` up to where it says its turn ends, or without the start of that marker when it was cut short."""
        if self.stop and self.stop in text:
            return text[: text.index(self.stop)]
        partial = next((n for n in range(len(self.stop) - 1, 0, -1) if text.endswith(self.stop[:n])), 0)
        return text[: len(text) - partial]

    def __call__(self, model, prompt: list[int]) -> str:
        import torch

        ids, new = list(prompt), []
        with torch.no_grad():
            for _ in range(self.max_new_tokens):
                logits = self.logits_fn(model, {"input_ids": torch.tensor([ids[-self.block_size :]])})
                token = int(logits[0, -1].argmax())
                if token == self.eos_id:
                    break
                ids.append(token)
                new.append(token)
                if self.stop and self.stop in self.tokenizer.decode(new):
                    break
        return self.cut(self.tokenizer.decode(new))
