"""Preference tuning (train.objective=dpo) for real, through the CLI: a transformers Llama with LoRA and a tokenizer
trained here with its own chat template learns to prefer the chosen answers (the rejected ones' log-probability falls
relative to the chosen), its figures in events and TensorBoard, and a SIGKILLed run resumes to the same losses; the
built-in GPT, fully fine-tuned against a frozen copy of its start, under DeepSpeed ZeRO-2 on two ranks; bad pairs
refused before a run directory exists."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from toolkit.rundir import RunDir

from conftest import cli
from test_chat import chat_tokenizer  # noqa: F401 (a fixture: a BPE tokenizer with a chat template of its own)
from test_checkpoint import CKPT, EVERY, STEPS
from test_your_data import llama, token_files_in, write_jsonl

pytestmark = pytest.mark.usefixtures("private_cache")


def pairs(count: int, turns: bool) -> list[dict]:
    """Sums asked for; the chosen answer gives the sum, the rejected one refuses. With ``turns``, the prompt is a
    conversation and the chosen answer an assistant turn (TRL's conversational shape)."""
    rng = random.Random(5)
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 30), rng.randint(0, 30)
        question, chosen, rejected = f"{a}+{b}?", f"{a + b}.", "No idea!"
        if turns:
            rows.append({"prompt": [{"role": "system", "content": "You add."}, {"role": "user", "content": question}],
                         "chosen": [{"role": "assistant", "content": chosen}], "rejected": rejected})
        else:
            rows.append({"prompt": question, "chosen": chosen, "rejected": rejected})
    return rows


def preference_gap(event: dict) -> float:
    """The policy's log-probability of the chosen answers minus that of the rejected ones."""
    return event["chosen_logps"] - event["rejected_logps"]


def test_dpo_with_lora_prefers_the_chosen_answers_logs_its_figures_and_resumes_exactly(tmp_path, chat_tokenizer,
                                                                                      rng):
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs(200, turns=True))
    flags = [*llama(320), "--set", f"data.path={data}", "--set", f"data.tokenizer={chat_tokenizer}",
             "--set", "data.chat=messages", "--set", "train.objective=dpo", "--set", "model.block_size=48",
             "--set", "model.lora.rank=8", "--set", "optim.lr=0.01", *CKPT]
    reference = cli("train", "tiny", "--run-dir", str(tmp_path / "ref"), *flags)
    assert reference.returncode == 0, reference.stderr[-3000:]
    run = RunDir(tmp_path / "ref")
    train = run.events("train")
    # the adapters start at zero: the policy is its reference, so the first step's loss is log 2 exactly
    assert train[0]["loss"] == pytest.approx(math.log(2), abs=1e-5) and train[0]["reward_margin"] == 0
    early, late = train[:5], train[-5:]
    assert np.mean([preference_gap(e) for e in late]) > np.mean([preference_gap(e) for e in early]) + 5, train
    assert np.mean([e["reward_accuracy"] for e in late]) > 0.9
    assert np.mean([e["loss"] for e in late]) < 0.5
    last_eval = run.events("eval")[-1]
    assert last_eval["val_reward_accuracy"] > 0.9 and "val_bpb" not in last_eval
    board = EventAccumulator(str(run.tb_dir))
    board.Reload()
    assert {"dpo/reward_margin", "dpo/reward_accuracy", "dpo/chosen_logps", "dpo/rejected_logps",
            "eval/dpo_reward_accuracy"} <= set(board.Tags()["scalars"])

    # trainbook evaluate: the rejected answers' held-out loss rose against the chosen ones', from the same start
    evaluated = cli("evaluate", str(run.path), "--json", "--examples", "2")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout)
    scores = {s["name"]: s for s in report["scores"]}
    chosen, rejected = scores["loss on the chosen answers"], scores["loss on the rejected answers"]
    assert rejected["after"] - chosen["after"] > rejected["before"] - chosen["before"] + 0.5, scores
    assert [s["expected"] for s in report["samples"]] == [s["expected"].rstrip(".") + "." for s in report["samples"]]
    assert report["step"] == STEPS and report["checkpoint"] == f"step_{STEPS:08d}"

    kill_at = rng.randint(EVERY + 1, STEPS - 1)
    killed = cli("train", "tiny", "--run-dir", str(tmp_path / "killed"), *flags, "--set",
                 f"fault.kill_at_step={kill_at}", "--max-restarts", "1")
    assert killed.returncode == 0, f"kill at {kill_at}: {killed.stderr[-3000:]}"
    losses = {e["step"]: e["loss"] for e in train}
    resumed = {e["step"]: e["loss"] for e in RunDir(tmp_path / "killed").events("train")}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [(s, resumed[s]) for s in resumed if resumed[s] != losses[s]] == [], f"kill at {kill_at}"


@pytest.mark.slow
def test_a_full_dpo_fine_tune_of_the_builtin_gpt_runs_under_deepspeed_zero2_on_two_ranks(tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs(200, turns=False))
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", f"data.path={data}",
               "--set", "train.objective=dpo", "--set", "model.block_size=24", "--set", "train.log_every=1",
               "--set", "train.max_steps=30", "--nproc", "2", "--engine", "deepspeed", "--set", "engine.zero_stage=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = RunDir(tmp_path / "r").events("train")
    # the reference is a frozen copy of the starting weights: identical to the policy before the first update
    assert train[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert np.mean([preference_gap(e) for e in train[-5:]]) > np.mean([preference_gap(e) for e in train[:5]]) + 5
    assert train[-1]["tokens_per_s"] > 0 and len(train[-1]["peak_memory_mb"]) == 2
    # its export checks ONNX against torch on held-out text: the chosen answers of the validation pairs
    exported = cli("export", str(tmp_path / "r"), "--json")
    assert exported.returncode == 0 and json.loads(exported.stdout)["parity_ok"], exported.stderr[-3000:]


def test_a_pair_whose_answers_are_the_same_is_refused_before_a_run_directory_exists(tmp_path):
    rows = pairs(50, turns=False)
    rows[6]["rejected"] = rows[6]["chosen"]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", f"data.path={data}",
               "--set", "train.objective=dpo")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"line 7 of {data!r} has the same text in 'chosen' and 'rejected': nothing to prefer" in proc.stderr
    assert not (tmp_path / "r").exists() and not token_files_in(tmp_path / "cache")


@pytest.mark.parametrize("flags, problem", [
    (["--examples", "-1"], "examples: -1 is not allowed; allowed: a whole number from 0 to 512"),
    (["--max-new-tokens", "0"], "max_new_tokens: 0 is not allowed; allowed: a whole number from 1 to 512"),
    ([], "is not a run directory (no config.yaml)"),
])
def test_evaluate_refuses_bad_numbers_and_a_folder_that_is_not_a_run(tmp_path, flags, problem):
    proc = cli("evaluate", str(tmp_path), *flags)
    assert proc.returncode == 2 and problem in proc.stderr, proc.stderr
