"""Tokenizers and datasets for a user's model, for real: tokenizers trained and registered through the CLI, saved
and loaded back by plain transformers, token files built once per (content, tokenizer, format), JSON Lines with
completion-only loss, labelled text for classifiers, bad lines refused before a run exists, exact resume."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from toolkit import config as config_mod
from toolkit.catalogue import data_assets
from toolkit.data import corpus as data_mod
from toolkit.data.batch import IGNORE_INDEX
from toolkit.data.tokenizer_training import EOS_TOKEN, train_bpe
from toolkit.data.tokenizers import ByteTokenizer, TokenizerError, check_tokenizer_fits, load_tokenizer
from toolkit.rundir import RunDir

from conftest import cli
from test_checkpoint import CKPT, EVERY, STEPS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("private_cache")]  # token files of each test's own


def llama(vocab: int, task: str = "causal_lm", **extra) -> list[str]:
    """CLI flags for a 2-layer, 64-wide Llama from a config (seconds to train)."""
    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": vocab, "max_position_embeddings": 128, **extra}
    return ["--set", "model.name=hf", "--set", "model.hf.architecture=llama", "--set", f"model.hf.task={task}",
            "--set", "model.hf.config=" + json.dumps(sizes)]


def qa_examples(count: int = 600) -> list[dict]:
    rows = []
    for i in range(count):
        a, b = i % 23, (i * 7) % 31
        rows.append({"prompt": f"Q: what is {a} plus {b}?\nA:", "completion": f" {a + b}.", "id": i})
    return rows


def reviews(count: int = 300) -> list[dict]:
    good, bad = ["good", "great", "lovely", "fine"], ["bad", "awful", "poor", "ugly"]
    nouns = ["soup", "film", "room", "book", "train", "song"]
    rng = random.Random(7)
    rows = []
    for i in range(count):
        label = rng.choice(["pos", "neg"])
        words = good if label == "pos" else bad
        rows.append({"text": f"{rng.choice(words)} {rng.choice(nouns)}, review {i}", "label": label})
    return rows


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """``bpe(vocab)``: a folder holding a byte-level BPE tokenizer trained on pydoc (saved as transformers does)."""
    root = tmp_path_factory.mktemp("tokenizers")
    made = {}

    def get(vocab: int = 400):
        if vocab not in made:
            from toolkit.data.shipped import pydoc_documents

            tokenizer = train_bpe([d.decode() for d in pydoc_documents()], vocab)
            made[vocab] = root / f"bpe{vocab}"
            tokenizer.save_pretrained(str(made[vocab]))
        return made[vocab]

    return get


def load(*overrides: str) -> config_mod.Config:
    return config_mod.load("tiny", list(overrides))


def token_files_in(cache) -> list:
    """The token files in a cache (not their companions: .starts, .mask, .labels, .meta)."""
    folder = cache / "tokens"
    return sorted(p for p in folder.glob("*.u*") if p.stem.count(".") == 0) if folder.is_dir() else []


# --- tokenizers ---------------------------------------------------------------------------------------------------


def test_a_tokenizer_trained_through_the_cli_is_registered_by_content(tmp_path):
    from transformers import AutoTokenizer

    ws = str(tmp_path / "ws")
    assert cli("data", "--workspace", ws, "register-builtin", "pydoc").returncode == 0
    first = cli("data", "--workspace", ws, "tokenizer", "train", "pydoc", "--vocab", "400")
    assert first.returncode == 0 and first.stdout.split() == ["pydoc-bpe400:1"], first.stderr
    again = cli("data", "--workspace", ws, "tokenizer", "train", "pydoc:1", "--vocab", "400")
    assert again.stdout.split() == ["pydoc-bpe400:1"], "the same asset and vocabulary give the same content"
    named = cli("data", "--workspace", ws, "tokenizer", "train", "pydoc", "--vocab", "300", "--name", "small")
    assert named.stdout.split() == ["small:1"], named.stderr

    from toolkit.catalogue.workspace import Workspace

    asset = data_assets.get(Workspace.open(ws), "pydoc-bpe400:1")
    assert asset.type == "uri_folder" and asset.tags["kind"] == "tokenizer" and asset.tags["trained_on"] == "pydoc:1"
    plain = AutoTokenizer.from_pretrained(str(asset.path))
    assert len(plain) == 400 and plain.eos_token == EOS_TOKEN and plain.eos_token_id == 0
    text = "def f(x):\n    return x  # héllo\n"
    assert plain.decode(plain.encode(text)) == text and len(plain.encode(text)) < len(text.encode())

    cfg = load("data.tokenizer=pydoc-bpe400", f"data.workspace={ws}")
    assert load_tokenizer(cfg).encode(text) == plain.encode(text)
    refused = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "data.asset=pydoc-bpe400",
                  "--set", f"data.workspace={ws}")
    assert refused.returncode == 2 and "data.asset: pydoc-bpe400:1 is a tokenizer, not data" in refused.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, message", [
    (["nothing", "--vocab", "400"], "data asset: 'nothing' is not registered"),
    (["pydoc", "--vocab", "100"], "--vocab: 100 is out of range; allowed: an integer from 257"),
    (["pydoc", "--vocab", "999999999"], "--vocab: 999999999 is out of range"),
    (["pydoc", "--vocab", "400", "--name", "pydoc"], "--name: 'pydoc' is the name of data asset pydoc:1"),
    (["pydoc", "--vocab", "400", "--name", "a/b"], "--name: 'a/b' is not allowed"),
])
def test_tokenizer_training_refuses_bad_input_and_registers_nothing(tmp_path, args, message):
    ws = str(tmp_path / "ws")
    cli("data", "--workspace", ws, "register-builtin", "pydoc")
    proc = cli("data", "--workspace", ws, "tokenizer", "train", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    listed = json.loads(cli("data", "--workspace", ws, "list", "--json").stdout)["assets"]
    assert [a["ref"] for a in listed] == ["pydoc:1"], "only pydoc:1 is registered"


def _model_folder(tmp_path, tokenizer_folder, vocab: int):
    """A save_pretrained folder of a small Llama with the tokenizer saved beside its weights."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "model"
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, vocab_size=vocab)).save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(tokenizer_folder)).save_pretrained(str(folder))
    return folder


def test_every_tokenizer_saves_what_plain_transformers_loads_and_uses_alike(tmp_path, bpe, rng):
    from transformers import AutoTokenizer

    from toolkit.data.tokenizer_training import train_tokenizer
    from toolkit.catalogue.workspace import Workspace

    ws = Workspace.open(tmp_path / "ws")
    (tmp_path / "corpus.txt").write_text("".join(f"line {i}: the quick brown fox {i * i}\n" for i in range(2000)))
    data_assets.register(ws, "lines", tmp_path / "corpus.txt", type="uri_file")
    registered = train_tokenizer(ws, "lines", 300, progress=False)
    model = _model_folder(tmp_path, bpe(400), 512)
    configs = {
        "bytes": load("data.tokenizer=bytes"),
        "registered": load(f"data.tokenizer={registered.ref}", f"data.workspace={ws.root}"),
        "folder": load(f"data.tokenizer={bpe(400)}"),
        "model": load("model.name=hf", f"model.hf.source={model}", "data.tokenizer=model"),
        "auto": load("model.name=hf", f"model.hf.source={model}"),
    }
    texts = ["", "plain ascii", "tabs\tand\nnewlines\n\n", "ünïcödé 日本語 🐍", " leading and trailing  "]
    texts += ["".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(1, 40))) for _ in range(50)]
    for kind, cfg in configs.items():
        ours = load_tokenizer(cfg)
        out = tmp_path / f"saved-{kind}"
        ours.save(out)
        plain = AutoTokenizer.from_pretrained(str(out))
        for text in texts:
            ids = ours.encode(text)
            assert plain.encode(text) == list(ids), (kind, text)
            assert plain.decode(ids) == ours.decode(ids) == text, (kind, text)
        assert load_tokenizer(load(f"data.tokenizer={out}")).sha256 == ours.sha256, f"{kind}: same identity saved"
    assert load_tokenizer(configs["auto"]).sha256 == load_tokenizer(configs["folder"]).sha256
    assert isinstance(load_tokenizer(configs["bytes"]), ByteTokenizer)
    saved_bytes = load(f"data.tokenizer={tmp_path / 'saved-bytes'}")
    assert isinstance(load_tokenizer(saved_bytes), ByteTokenizer), "the byte tokenizer's files are the byte tokenizer"

    plain_bytes = AutoTokenizer.from_pretrained(str(tmp_path / "saved-bytes"))
    for _ in range(200):  # any bytes at all: ids are the byte values, invalid UTF-8 decodes as Python replaces it
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 30)))
        assert plain_bytes.decode(list(raw)) == ByteTokenizer().decode(raw) == raw.decode("utf-8", errors="replace")


def test_a_tokenizer_larger_than_the_models_embedding_is_refused_naming_both_sizes(bpe):
    from toolkit.train.models import build_model

    gpt = load(f"data.tokenizer={bpe(400)}")
    with pytest.raises(TokenizerError, match=r"has 400 ids but the model's input embedding has 256 rows"):
        check_tokenizer_fits(gpt, build_model(gpt.model))
    check_tokenizer_fits(load(), build_model(gpt.model))  # bytes fit the byte-level GPT

    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 2}
    small = load("model.name=hf", "model.hf.architecture=llama", f"data.tokenizer={bpe(400)}",
                 "model.hf.config=" + json.dumps({**sizes, "vocab_size": 300}))
    with pytest.raises(TokenizerError, match=r"has 400 ids but the model's input embedding has 300 rows"):
        check_tokenizer_fits(small, build_model(small.model))
    big = load("model.name=hf", "model.hf.architecture=llama", f"data.tokenizer={bpe(400)}",
               "model.hf.config=" + json.dumps({**sizes, "vocab_size": 512}))
    check_tokenizer_fits(big, build_model(big.model))


def test_auto_pins_the_models_tokenizer_and_a_changed_tokenizer_is_refused(tmp_path, bpe):
    import shutil

    from toolkit.runs.data_pin import pin_tokenizer

    model = _model_folder(tmp_path, bpe(400), 512)
    pinned = pin_tokenizer(load("model.name=hf", f"model.hf.source={model}"))
    assert pinned.data.tokenizer == "model" and pinned.data.tokenizer_sha256 == load_tokenizer(pinned).sha256
    assert pin_tokenizer(load()).data.tokenizer == "bytes" and pin_tokenizer(load()).data.tokenizer_sha256 == ""

    for name in ("tokenizer.json", "tokenizer_config.json"):  # the folder's tokenizer replaced after the run began
        shutil.copy(bpe(300) / name, model / name)
    with pytest.raises(TokenizerError, match=r"the tokenizer the run was started with \(sha256 "
                                             + pinned.data.tokenizer_sha256 + r"\)") as refused:
        load_tokenizer(pinned)
    assert "its files changed since the run started" in str(refused.value)


# --- token files --------------------------------------------------------------------------------------------------


def test_token_files_are_built_once_per_content_tokenizer_and_format(tmp_path, bpe):
    docs = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"document {i}: " + "words " * (i % 7), "n": i}
                                                 for i in range(400)])
    cache = tmp_path / "cache"
    first = data_mod.load_corpus(load(f"data.path={docs}", f"data.tokenizer={bpe(400)}"))
    (built,) = token_files_in(cache)
    assert built.suffix == ".u16" and first.splits["train"].dtype.itemsize == 2, "400 ids need 16 bits"
    assert first.tokenizer["key"] in built.name and first.sha256 in built.name
    mtime = built.stat().st_mtime_ns
    again = data_mod.load_corpus(load(f"data.path={docs}", f"data.tokenizer={bpe(400)}"))
    assert token_files_in(cache) == [built] and built.stat().st_mtime_ns == mtime, "the second run reuses it"
    assert np.array_equal(again.splits["val"].numpy(), first.splits["val"].numpy())

    data_mod.load_corpus(load(f"data.path={docs}", f"data.tokenizer={bpe(300)}"))
    data_mod.load_corpus(load(f"data.path={docs}", "data.tokenizer=bytes"))
    files = token_files_in(cache)
    assert len(files) == 3 and sorted(p.suffix for p in files) == [".u16", ".u16", ".u8"], files
    meta = json.loads(built.with_name(built.stem + ".meta.json").read_text())
    assert meta["records"] == 400 and meta["tokenizer"]["key"] == first.tokenizer["key"]


def test_documents_are_separated_by_eos_and_bits_per_byte_counts_the_validation_bytes_exactly(tmp_path, bpe):
    texts = [f"note {i}: " + "abc def " * (1 + i % 5) for i in range(300)]
    docs = write_jsonl(tmp_path / "docs.jsonl", [{"body": t} for t in texts])
    cfg = load(f"data.path={docs}", f"data.tokenizer={bpe(400)}", "data.text_field=body")
    corpus = data_mod.load_corpus(cfg)
    tokenizer = load_tokenizer(cfg)
    stream = np.concatenate([corpus.splits["train"].numpy(), corpus.splits["val"].numpy()]).astype(np.int64)
    assert (stream == tokenizer.eos_id).sum() == len(texts) - 1, "one EOS between two documents"
    assert tokenizer.hf.decode(stream, skip_special_tokens=True) == "".join(texts)
    val = corpus.splits["val"].numpy()
    val_bytes = len(tokenizer.hf.decode(val, skip_special_tokens=True).encode("utf-8"))  # ASCII: cut anywhere
    assert corpus.bytes_per_item == val_bytes / len(val)
    assert data_mod.bits_per_byte(2.0, corpus) == pytest.approx(2.0 / np.log(2) * len(val) / val_bytes)


# --- instruction data ---------------------------------------------------------------------------------------------


def test_instruction_batches_learn_from_completion_tokens_only(tmp_path, bpe):
    rows = qa_examples(200)
    qa = write_jsonl(tmp_path / "qa.jsonl", rows)
    cfg = load(f"data.path={qa}", f"data.tokenizer={bpe(400)}", "data.prompt_field=prompt",
               "data.completion_field=completion", "model.block_size=32")
    corpus = data_mod.load_corpus(cfg)
    tokenizer = load_tokenizer(cfg)
    by_prompt = {r["prompt"]: r["completion"] for r in rows}
    seen = 0
    for step in range(10):
        batch = data_mod.StepBatches(corpus, 16, seed=3, rank=0)[step]
        assert set(batch) == {"input_ids", "labels", "attention_mask"}
        assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (16, 32)
        for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
            length = int(mask.sum())
            assert mask[:length].all() and not mask[length:].any(), "padding only at the end"
            text = tokenizer.decode(ids[:length])
            prompt = text[:text.index("A:") + 2]
            completion_ids = tokenizer.encode(by_prompt[prompt]) + [tokenizer.eos_id]
            counted = labels[labels != IGNORE_INDEX].tolist()
            assert counted == completion_ids, (text, counted)
            prompt_len = len(tokenizer.encode(prompt))
            assert (labels[:prompt_len - 1] == IGNORE_INDEX).all(), "no loss where the next token is the prompt's"
            assert (labels[length - 1:] == IGNORE_INDEX).all(), "no loss on padding"
            seen += 1
    assert seen == 160
    val = [rows[i] for i in corpus.splits["val"]]  # bits per byte: the completions' bytes per counted token
    assert corpus.bytes_per_item == sum(len(r["completion"].encode()) for r in val) / \
        sum(len(tokenizer.encode(r["completion"])) + 1 for r in val)
    as_bytes = data_mod.load_corpus(load(f"data.path={qa}", "data.prompt_field=prompt",
                                         "data.completion_field=completion"))
    assert as_bytes.bytes_per_item == 1.0


def test_an_instruction_run_trains_and_resumes_exactly_after_sigkill(tmp_path, bpe, rng):
    """On 2 processes: each rank's share of the padded prompt/completion rows, and their positions, resume exactly."""
    processes = ("--nproc", "2")
    qa = write_jsonl(tmp_path / "qa.jsonl", qa_examples())
    flags = [*llama(512), "--set", f"data.path={qa}", "--set", f"data.tokenizer={bpe(400)}",
             "--set", "data.prompt_field=prompt", "--set", "data.completion_field=completion", *CKPT, *processes]
    reference = cli("train", "tiny", "--run-dir", str(tmp_path / "ref"), *flags)
    assert reference.returncode == 0, reference.stderr[-3000:]
    ref = RunDir(tmp_path / "ref")
    losses = {e["step"]: e["loss"] for e in ref.events("train")}
    assert np.mean([losses[s] for s in range(1, 6)]) > np.mean([losses[s] for s in range(36, 41)]) + 0.5, losses
    assert ref.events("eval")[-1]["val_bpb"] > 0
    lineage = json.loads(ref.lineage_path.read_text())["data"]
    assert lineage["tokenizer"]["sha256"] == ref.read_config().data.tokenizer_sha256 != ""

    kill_at = rng.randint(EVERY + 1, STEPS - 1)
    killed = cli("train", "tiny", "--run-dir", str(tmp_path / "killed"), *flags, "--set",
                 f"fault.kill_at_step={kill_at}", "--max-restarts", "1")
    assert killed.returncode == 0, f"kill at {kill_at}: {killed.stderr[-3000:]}"
    run = RunDir(tmp_path / "killed")
    assert run.read_status()["restarts"] == 1 and len(run.events("restart")) == 1
    resumed = {e["step"]: e["loss"] for e in run.events("train")}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [(s, resumed[s]) for s in resumed if resumed[s] != losses[s]] == [], f"kill at {kill_at}"


@pytest.mark.parametrize("content, problem", [
    ('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d"\n', "line 2 of {path!r} is not JSON"),
    ('{"prompt": "a", "completion": "b"}\n\n["x"]\n', "line 3 of {path!r} is ['x'], not a JSON object"),
    ('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "answer": "d"}\n', "line 2 of {path!r} has no field "
                                                                            "'completion'"),
])
def test_a_bad_jsonl_line_is_refused_before_a_run_directory_exists(tmp_path, content, problem):
    path = tmp_path / "qa.jsonl"
    path.write_text(content * 1 + "".join(json.dumps(r) + "\n" for r in qa_examples(50)))
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", f"data.path={path}",
               "--set", "data.prompt_field=prompt", "--set", "data.completion_field=completion")
    assert proc.returncode == 2, proc.stderr
    assert problem.format(path=str(path)) in proc.stderr, proc.stderr
    assert "allowed: one JSON object per line with string fields 'prompt'" in proc.stderr
    assert not (tmp_path / "r").exists() and not token_files_in(tmp_path / "cache")


DEEP = "[" * 100_000 + "]" * 100_000  # deeper than json's decoder goes (about 1,000 levels)
CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
    "name": "add", "arguments": "[" * 5_000 + "]" * 5_000}}]}


@pytest.mark.parametrize("flags, good, bad, problem", [
    ([], {"text": "a document"}, '{"text": "x", "meta": %s}' % DEEP, "line 4 of {path!r} is JSON nested too deeply"),
    (["--set", "data.chat=messages"], {"messages": CHAT}, '{"messages": %s}' % DEEP,
     "line 4 of {path!r} is JSON nested too deeply"),
    (["--set", "data.chat=messages"], {"messages": CHAT}, json.dumps({"messages": [CHAT[0], TOOL_CALL]}),
     "line 4 of {path!r} has a tool call 'add' in turn 2 that cannot be rendered (arguments: nested deeper than 32"),
    (["--set", "train.objective=dpo"], {"prompt": "q", "chosen": "a", "rejected": "b"},
     '{"prompt": "q", "chosen": "a", "rejected": %s}' % DEEP, "line 4 of {path!r} is JSON nested too deeply"),
], ids=["text", "chat", "tool-call-arguments", "dpo"])
def test_a_line_nested_too_deeply_is_refused_in_one_line_before_a_run_directory_exists(tmp_path, flags, good, bad,
                                                                                      problem):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n" * 2 + json.dumps(good) + "\n" + bad + "\n" + json.dumps(good) + "\n")
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", f"data.path={path}", *flags)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert problem.format(path=str(path)) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert not (tmp_path / "r").exists() and not token_files_in(tmp_path / "cache")


def test_a_huge_sparse_jsonl_is_refused_at_its_first_huge_line_under_a_memory_cap(tmp_path):
    """A 2 GB .jsonl whose second line never ends (a sparse file: no disk used), trained on under an address-space
    cap of 3 GiB above what the CLI holds at its start: it was read whole, twice over, before any check."""
    import resource
    import subprocess
    import sys

    from conftest import PROJECT

    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(json.dumps({"text": "a document"}).encode() + b"\n")
        f.truncate(2 << 30)

    def capped():
        with open("/proc/self/statm") as statm:
            held = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (held + (3 << 30), held + (3 << 30)))

    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", "tiny", "--run-dir", str(tmp_path / "r"),
                           "--set", f"data.path={path}"], cwd=PROJECT,
                          capture_output=True, text=True, timeout=300, preexec_fn=capped)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"line 2 of {str(path)!r} is over 67,108,864 bytes" in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


# --- labelled text ------------------------------------------------------------------------------------------------


def test_classification_batches_from_jsonl_and_from_an_mltable(tmp_path, bpe):
    import pandas as pd

    from toolkit.catalogue.mltable import write_mltable

    rows = reviews()
    jsonl = write_jsonl(tmp_path / "reviews.jsonl", rows)
    table = write_mltable(tmp_path / "table", pd.DataFrame({"review": [r["text"] for r in rows],
                                                            "stars": [int(r["label"] == "pos") for r in rows]}))
    classifier = ["model.name=hf", "model.hf.architecture=llama", "model.hf.task=sequence_classification",
                  "model.block_size=16"]
    for source, fields, names in ((jsonl, [], ["neg", "pos"]), (table, ["data.text_field=review",
                                                                        "data.label_field=stars"], None)):
        corpus = data_mod.load_corpus(load(*classifier, f"data.path={source}", f"data.tokenizer={bpe(400)}", *fields))
        assert corpus.label_names == names and corpus.bytes_per_item is None
        tokenizer = load_tokenizer(load(f"data.tokenizer={bpe(400)}"))
        for split in ("train", "val"):
            batch = corpus.batch(split, 8, data_mod._generator(0, 0, 1))
            assert batch["input_ids"].shape == batch["attention_mask"].shape == (8, 16)
            assert batch["labels"].shape == (8,)
            for ids, mask, label in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
                text = tokenizer.decode(ids[mask.bool()])
                expected = next(r for r in rows if r["text"] == text or len(ids) == mask.sum() and
                                r["text"].startswith(text))
                assert int(label) == int(expected["label"] == "pos"), (text, expected)
                assert mask.sum() == min(16, len(tokenizer.encode(expected["text"])))

    three = write_jsonl(tmp_path / "three.jsonl", rows + [{"text": "meh", "label": "bad"}])
    with pytest.raises(ValueError, match=r"model.hf.num_labels: 2 is too few for .*3 class names \(bad, neg, pos\)"):
        data_mod.load_corpus(load(*classifier, f"data.path={three}"))


def test_a_classifier_trains_on_labelled_jsonl(tmp_path):
    data = write_jsonl(tmp_path / "reviews.jsonl", reviews())
    # no pad_token_id in the model's config: the run gives it the tokenizer's (a classifier needs one for batches)
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *llama(256, "sequence_classification"),
               "--set", f"data.path={data}", "--set", "train.log_every=1", "--set", "optim.lr=0.01")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunDir(tmp_path / "r")
    losses = [e["loss"] for e in run.events("train")]
    assert np.mean(losses[:5]) > np.mean(losses[-5:]), losses
    assert run.events("eval")[-1]["val_loss"] < 0.6, run.events("eval")  # chance is ln 2 = 0.69
    assert json.loads(run.lineage_path.read_text())["data"]["label_names"] == ["neg", "pos"]


def test_a_parquet_table_needs_pyarrow_and_says_so(tmp_path):
    import yaml

    folder = tmp_path / "table"
    folder.mkdir()
    (folder / "part.parquet").write_bytes(b"PAR1 not really")
    (folder / "MLTable").write_text(yaml.safe_dump({"type": "mltable", "paths": [{"file": "./part.parquet"}],
                                                    "transformations": [{"read_parquet": {}}]}))
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *llama(256, "sequence_classification"),
               "--set", f"data.path={folder}")
    assert proc.returncode == 2 and "reads Parquet files (read_parquet), which needs pyarrow" in proc.stderr, \
        proc.stderr
    assert "allowed: CSV tables (read_delimited), or `pip install pyarrow` for Parquet" in proc.stderr
    assert not (tmp_path / "r").exists()


# --- every format: batches are a pure function of (seed, rank, step), rank shares are disjoint ------------------


def test_every_format_draws_the_same_batch_for_a_step_and_disjoint_rows_per_rank(tmp_path, bpe):
    qa = write_jsonl(tmp_path / "qa.jsonl", qa_examples(300))
    labelled = write_jsonl(tmp_path / "reviews.jsonl", reviews(300))
    text = tmp_path / "text.txt"
    text.write_text("".join(f"<{i:05d}>" for i in range(6000)))  # every window of 16 says where it starts
    corpora = {
        "packed bytes": load(f"data.path={text}", "model.block_size=16"),
        "packed bpe": load(f"data.path={text}", f"data.tokenizer={bpe(400)}", "model.block_size=16"),
        "instruction": load(f"data.path={qa}", "data.prompt_field=prompt", "data.completion_field=completion",
                            f"data.tokenizer={bpe(400)}"),
        "labelled": load("model.name=hf", "model.hf.architecture=llama", "model.hf.task=sequence_classification",
                         f"data.path={labelled}"),
    }
    for kind, cfg in corpora.items():
        corpus = data_mod.load_corpus(cfg)
        tokenizer = load_tokenizer(cfg)
        whole = tokenizer.decode(corpus.splits["train"].numpy()) if kind.startswith("packed") else ""
        drawn = []
        for rank in (0, 1):
            batches = data_mod.StepBatches(corpus, 16, seed=5, rank=rank, world_size=2)
            rows = set()
            for step in range(12):
                batch = batches[step]
                same = data_mod.StepBatches(corpus, 16, seed=5, rank=rank, world_size=2)[step]
                assert all(np.array_equal(batch[k], same[k]) for k in batch), f"{kind}: step {step} is not repeatable"
                for ids, mask in zip(batch["input_ids"], batch.get("attention_mask", batch["input_ids"] * 0 + 1)):
                    shown = tokenizer.decode(ids[mask.bool()])
                    rows.add(whole.index(shown) if whole else shown)  # a packed row: where its window starts
            drawn.append(rows)
        assert drawn[0] and drawn[1], kind
        if whole:  # windows start in the first half for rank 0, in the second for rank 1
            assert max(drawn[0]) < min(drawn[1]), kind
        assert not drawn[0] & drawn[1], (kind, sorted(drawn[0] & drawn[1])[:5])
        other_seed = data_mod.StepBatches(corpus, 16, seed=6, rank=0, world_size=2)[0]
        assert not np.array_equal(other_seed["input_ids"], data_mod.StepBatches(corpus, 16, seed=5, rank=0,
                                                                                world_size=2)[0]["input_ids"]), kind


# --- the standard library as an asset ----------------------------------------------------------------------------


def test_stdlib_registers_as_the_builtin_code_corpus(tmp_path):
    from toolkit.data.shipped import stdlib_text

    ws = str(tmp_path / "ws")
    proc = cli("data", "--workspace", ws, "register-builtin", "stdlib")
    assert proc.returncode == 0 and proc.stdout.split() == ["stdlib:1"], proc.stderr
    from toolkit.catalogue.workspace import Workspace

    asset = data_assets.get(Workspace.open(ws), "stdlib:1")
    text = stdlib_text()
    assert asset.type == "uri_file" and asset.path.read_bytes() == text and len(text) > 5_000_000
    assert text.startswith(b"# file: ") and b"\n\n# file: os.py\n" in text
    registered = data_mod.load_corpus(load("data.asset=stdlib", f"data.workspace={ws}"))
    builtin = data_mod.load_corpus(load("data.dataset=stdlib"))
    for split in ("train", "val"):
        assert np.array_equal(registered.splits[split].numpy(), builtin.splits[split].numpy()), split
    assert cli("data", "--workspace", ws, "register-builtin", "stdlib").stdout.split() == ["stdlib:1"]


def test_auto_finds_the_tokenizer_of_a_registered_model_to_start_from(tmp_path, finished_run_copy):
    from toolkit.catalogue.model_registry import register_model
    from toolkit.catalogue.workspace import Workspace
    from toolkit.data.tokenizers import model_tokenizer_folder
    from toolkit.deploy.export import export_run

    ws = Workspace.open(tmp_path / "ws")
    model = register_model(ws, export_run(finished_run_copy().path).path, name="base")
    cfg = load("model.init_from=base:1", f"data.workspace={ws.root}")
    assert model_tokenizer_folder(cfg) == model.path, "the registered snapshot's own tokenizer"
    assert isinstance(load_tokenizer(cfg), ByteTokenizer), "a byte-level model's export holds the byte tokenizer"
    assert model_tokenizer_folder(load("model.init_from=nothing:3", f"data.workspace={ws.root}")) is None


def test_the_cli_refuses_a_tokenizer_the_model_cannot_embed_before_a_run_directory_exists(bpe, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("train", "tiny", "--run-dir", str(run_dir), "--set", f"data.tokenizer={bpe(400)}")
    assert proc.returncode != 0
    assert "has 400 ids but the model's input embedding has 256 rows" in proc.stderr, proc.stderr
    assert not run_dir.exists(), "refused before the run directory exists"
