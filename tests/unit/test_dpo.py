"""DPO (train.objective=dpo): the loss against TRL's formulas on the same batch, the LoRA reference (the model with
its adapters off), preference pairs read into rows with labels on the answers only, and bad pairs and configs
refused naming the field, the file and the line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from toolkit import config
from toolkit.data.batch import CHOSEN, IGNORE_INDEX, REJECTED
from toolkit.data.chat import CHATML
from toolkit.data.corpus import load_corpus
from toolkit.data.documents import DataFormat, DataFormatError, file_records
from toolkit.train.models import loss_function, prepare_model
from toolkit.train.objectives import DPO, FrozenCopy, build_objective

pytestmark = pytest.mark.usefixtures("private_cache")

BLOCK = 16


def trl_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """TRL's DPOTrainer (trl/trainer/dpo_trainer.py, concatenated_forward): per-token log-probabilities gathered
    from log_softmax, masked where the labels are the ignore index, summed per row."""
    loss_mask = labels != IGNORE_INDEX
    labels = labels.clone()
    labels[~loss_mask] = 0
    per_token = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    return (per_token * loss_mask).sum(-1)


def trl_sigmoid_loss(chosen, rejected, ref_chosen, ref_rejected, beta):
    """TRL's DPOTrainer.dpo_loss, loss_type='sigmoid', label_smoothing=0."""
    logits = (chosen - rejected) - (ref_chosen - ref_rejected)
    return -F.logsigmoid(beta * logits).mean(), beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)


def pair_batch(pairs: int = 4, prompt: int = 5) -> dict:
    """Random pairs over bytes: rows of BLOCK tokens, labels on the answer (after ``prompt`` tokens) only, the
    rejected answers shorter (padding after them)."""
    g = torch.Generator().manual_seed(0)
    batch = {}
    for prefix, length in ((CHOSEN, BLOCK), (REJECTED, BLOCK - 4)):
        ids = torch.randint(0, 256, (pairs, BLOCK), generator=g)
        labels = torch.randint(0, 256, (pairs, BLOCK), generator=g)
        labels[:, :prompt] = IGNORE_INDEX
        labels[:, length:] = IGNORE_INDEX
        mask = torch.zeros(pairs, BLOCK, dtype=torch.long)
        mask[:, :length] = 1
        batch |= {prefix + "input_ids": ids, prefix + "labels": labels, prefix + "attention_mask": mask}
    return batch


def tiny(overrides=()) -> config.Config:
    return config.load("tiny", [f"model.block_size={BLOCK}", "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
                                "data.path=pairs.jsonl", "train.objective=dpo", *overrides])


def test_the_dpo_loss_and_rewards_are_trls_on_the_same_batch():
    cfg = tiny(["train.dpo_beta=0.3"])
    policy = prepare_model(cfg)[0]
    reference = prepare_model(config.load("tiny", [f"model.block_size={BLOCK}", "model.n_layer=1", "model.n_embd=32",
                                                   "model.n_head=2", "train.seed=7"]))[0]
    dpo = DPO(0.3, lambda model, batch: model(batch["input_ids"]), FrozenCopy(reference))
    batch = pair_batch()
    loss = dpo(policy, batch)
    loss.backward()
    figures = dpo.collect("train", torch.device("cpu"))

    with torch.no_grad():
        logps = {name: trl_logps(model(batch[prefix + "input_ids"]), batch[prefix + "labels"])
                 for name, model, prefix in (("chosen", policy, CHOSEN), ("rejected", policy, REJECTED),
                                             ("ref_chosen", reference, CHOSEN), ("ref_rejected", reference, REJECTED))}
    expected, chosen_rewards, rejected_rewards = trl_sigmoid_loss(**logps, beta=0.3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert abs(loss.item() - math.log(2)) > 1e-3  # two different models: not the trivial value
    assert figures["chosen_reward"] == pytest.approx(chosen_rewards.mean().item(), rel=1e-4, abs=1e-6)
    assert figures["rejected_reward"] == pytest.approx(rejected_rewards.mean().item(), rel=1e-4, abs=1e-6)
    assert figures["reward_accuracy"] == (chosen_rewards > rejected_rewards).float().mean().item()
    assert figures["chosen_logps"] == pytest.approx(logps["chosen"].mean().item(), rel=1e-5)
    # gradients reach the policy, never the frozen reference; the figures were reset by collect
    assert all(p.grad is not None for p in policy.parameters() if p.requires_grad)
    assert all(p.grad is None for p in reference.parameters())
    assert dpo.collect("train", torch.device("cpu")) == {}


def test_with_lora_the_reference_is_the_model_with_its_adapters_off():
    cfg = tiny(["model.lora.rank=4", 'model.lora.target_modules=["qkv","proj"]'])
    model = prepare_model(cfg)[0]
    dpo = build_objective(cfg, model, torch.device("cpu"))
    batch = pair_batch()
    # peft starts each adapter's B at zero: the policy is its reference, every margin 0, the loss log 2
    assert dpo(model, batch).item() == pytest.approx(math.log(2), abs=1e-6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    moved = dpo(model, batch)
    assert abs(moved.item() - math.log(2)) > 1e-3
    base = prepare_model(config.load("tiny", [f"model.block_size={BLOCK}", "model.n_layer=1", "model.n_embd=32",
                                              "model.n_head=2"]))[0]  # the same seed: the weights under the adapters
    with torch.no_grad(), dpo.reference() as reference:
        assert torch.equal(reference(batch[CHOSEN + "input_ids"]), base(batch[CHOSEN + "input_ids"]))
    assert not torch.equal(model(batch[CHOSEN + "input_ids"]), base(batch[CHOSEN + "input_ids"]))  # on again


def write_pairs(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


PAIRS = [{"prompt": f"{a}+{a}=", "chosen": f"{2 * a}.", "rejected": f"{2 * a + 1}."} for a in range(40)]


def test_text_pairs_become_two_halves_with_labels_on_each_answer_and_its_end(tmp_path):
    cfg = config.load("tiny", [f"model.block_size={BLOCK}", f"data.path={write_pairs(tmp_path / 'p.jsonl', PAIRS)}",
                               "train.objective=dpo", "data.val_fraction=0.25"])
    corpus = load_corpus(cfg)
    assert len(corpus.splits["train"]) == 30 and len(corpus.splits["val"]) == 10  # split by pair
    batch = corpus.batch("train", 6, torch.Generator().manual_seed(0))
    assert sorted(batch) == sorted(p + k for p in (CHOSEN, REJECTED) for k in ("input_ids", "labels", "attention_mask"))
    for row in range(6):
        texts = {}
        for prefix in (CHOSEN, REJECTED):
            ids, labels = batch[prefix + "input_ids"][row], batch[prefix + "labels"][row]
            length = int(batch[prefix + "attention_mask"][row].sum())
            texts[prefix] = bytes(ids[:length].tolist()).decode()
            learned = bytes(labels[labels != IGNORE_INDEX].tolist()).decode()
            prompt, answer = texts[prefix].split("=")
            assert learned == answer and answer.endswith(".\n\n")  # the answer and its end, nothing of the prompt
        a = int(texts[CHOSEN].split("+")[0])
        assert texts[CHOSEN] == f"{a}+{a}={2 * a}.\n\n" and texts[REJECTED] == f"{a}+{a}={2 * a + 1}.\n\n"


def test_conversational_pairs_render_with_the_template_and_learn_only_the_answer(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": r["prompt"]}],
             "chosen": [{"role": "assistant", "content": r["chosen"]}], "rejected": r["rejected"]} for r in PAIRS]
    cfg = config.load("tiny", ["model.block_size=128", f"data.path={write_pairs(tmp_path / 'c.jsonl', rows)}",
                               "train.objective=dpo", "data.chat=messages"])
    batch = load_corpus(cfg).batch("val", 2, torch.Generator().manual_seed(1))
    ids, labels = batch[REJECTED + "input_ids"][0], batch[REJECTED + "labels"][0]
    text = bytes(ids[: int(batch[REJECTED + "attention_mask"][0].sum())].tolist()).decode()
    assert text.startswith("<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n") and CHATML
    answer = text.split("<|im_start|>assistant\n")[1]
    assert answer.endswith(".<|im_end|>\n")
    assert bytes(labels[labels != IGNORE_INDEX].tolist()).decode() == answer  # the answer and its end marker


FMT = DataFormat("preference")


@pytest.mark.parametrize("row, chat, problem", [
    ({"prompt": "2+2=", "chosen": "4.", "rejected": "4."}, "",
     "line 1 of 'p.jsonl' has the same text in 'chosen' and 'rejected': nothing to prefer"),
    ({"prompt": "2+2=", "chosen": "4."}, "", "line 1 of 'p.jsonl' has no field 'rejected'"),
    ({"prompt": "2+2=", "chosen": " ", "rejected": "5"}, "", "line 1 of 'p.jsonl' has ' ', not a non-empty answer, "
                                                             "in field 'chosen'"),
    ({"prompt": [{"role": "user", "content": "2+2="}], "chosen": "4", "rejected": "5"}, "",
     "line 1 of 'p.jsonl' has [{'role': 'user', 'content': '2+2='}] in 'prompt', not text"),
    ({"prompt": "2+2=", "chosen": "4", "rejected": "5"}, "messages",
     "line 1 of 'p.jsonl' has '2+2=' in 'prompt', not a list of turns"),
    ({"prompt": [{"role": "human", "content": "2+2="}], "chosen": "4", "rejected": "5"}, "messages",
     "line 1 of 'p.jsonl' has role 'human' in turn 1"),
    ({"prompt": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}], "chosen": "4",
      "rejected": "5"}, "messages",
     "line 1 of 'p.jsonl' has a 'prompt' that ends with an assistant turn (turn 2), where the answer starts"),
    ({"prompt": [{"role": "user", "content": "2+2="}], "chosen": [{"role": "user", "content": "4"}],
      "rejected": "5"}, "messages", "line 1 of 'p.jsonl' has [{'role': 'user', 'content': '4'}], not a non-empty "
                                    "answer, in field 'chosen'"),
])
def test_a_bad_pair_is_refused_naming_the_line_and_the_field(row, chat, problem):
    with pytest.raises(DataFormatError) as caught:
        file_records("p.jsonl", (json.dumps(row) + "\n").encode(), DataFormat("preference", chat=chat), "'p.jsonl'")
    assert problem in str(caught.value)


@pytest.mark.parametrize("overrides, problem", [
    (["model.name=digits_mlp", "data.dataset=digits", "data.path=p.jsonl"], "train.objective: 'dpo' needs a causal language model"),
    (["data.path="], "data.asset: is empty, and train.objective=dpo needs preference pairs"),
    (["data.path=p.jsonl", "data.pack=true"], "data.pack: True is not used by preference pairs"),
    (["data.path=p.jsonl", "data.chat=sharegpt"], "data.chat: 'sharegpt' is not allowed"),
    (["data.path=p.jsonl", "train.dpo_beta=0"], "train.dpo_beta"),
    (["data.path=p.jsonl", "engine.name=deepspeed", "engine.zero_stage=3"],
     "engine.zero_stage: 3 would keep the reference, a frozen copy of the whole model, unpartitioned on every rank"),
])
def test_a_dpo_config_that_cannot_work_is_refused_naming_the_field(overrides, problem):
    with pytest.raises(config.ConfigError) as caught:
        config.load("tiny", ["train.objective=dpo", *overrides])
    assert problem in str(caught.value)


def test_the_model_objective_is_the_models_own_loss():
    cfg = config.load("tiny", [f"model.block_size={BLOCK}", "model.n_layer=1", "model.n_embd=32", "model.n_head=2"])
    model = prepare_model(cfg)[0]
    objective = build_objective(cfg, model, torch.device("cpu"))
    batch = {"input_ids": torch.randint(0, 256, (2, BLOCK)), "labels": torch.randint(0, 256, (2, BLOCK))}
    assert torch.equal(objective(model, batch), loss_function(cfg.model)(model, batch))
    assert objective.collect("train", torch.device("cpu")) == {} and FMT.allowed()


def test_dpo_figures_are_the_scalars_tensorboard_and_mlflow_show():
    from toolkit.events import EvalEvent, TrainEvent
    from toolkit.train.scalars import DPO_FIGURES, scalars

    figures = {name: float(i) for i, name in enumerate(DPO_FIGURES)}
    train = TrainEvent(step=3, loss=0.6, lr=1e-3, tokens_per_s=10.0, data_wait_pct=0.0, mfu=0.1, elapsed_s=1.0,
                       **figures)
    assert {tag: v for tag, v in scalars(train).items() if tag.startswith("dpo/")} == {
        f"dpo/{name}": v for name, v in figures.items()}
    val = EvalEvent(step=3, val_loss=0.6, **{f"val_{name}": v for name, v in figures.items()})
    assert scalars(val)["eval/dpo_reward_accuracy"] == figures["reward_accuracy"]


def test_a_pairs_two_rows_read_the_same_prompt_however_long_their_answers():
    import numpy as np

    from toolkit.data.corpus import ExampleCorpus
    from toolkit.data.token_files import TokenFiles

    prompt = np.arange(1, 41, dtype=np.uint8)  # 40 prompt tokens; the rows hold 49 (block_size 48 + 1)
    chosen, rejected = np.full(5, 100, np.uint8), np.full(30, 200, np.uint8)  # short and long answers
    examples = [np.concatenate([prompt, chosen]), np.concatenate([prompt, rejected])] * 2  # two pairs
    masks = [np.concatenate([np.zeros(40, np.uint8), np.ones(len(e) - 40, np.uint8)]) for e in examples]
    starts = np.concatenate([[0], np.cumsum([len(e) for e in examples])]).astype(np.int64)
    files = TokenFiles(None, np.concatenate(examples), starts, np.concatenate(masks), None, {"bytes": int(starts[-1])})
    corpus = ExampleCorpus("pairs", files, "0" * 64, 48, 0.5, 0, np.ones(256, dtype=np.int64), mode="preference")
    batch = corpus.batch("train", 1, torch.Generator().manual_seed(0))
    rows = {prefix: batch[prefix + "input_ids"][0].tolist() for prefix in (CHOSEN, REJECTED)}
    # alone, the chosen row would keep all 40 prompt tokens and the rejected row its last 24 (fit_example keeps
    # half the row for a long answer): together both keep the same 24, so the margin compares answers, not contexts
    assert rows[CHOSEN][:24] == rows[REJECTED][:24] == list(range(17, 41))
    assert rows[CHOSEN][24:29] == [100] * 5 and rows[REJECTED][24:48] == [200] * 24
