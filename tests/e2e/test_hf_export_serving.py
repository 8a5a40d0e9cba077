"""Export and serving for Hugging Face transformers models: a Llama trained a few steps through the CLI is exported
as a folder plain transformers loads (checked in a fresh process that never imports Trainbook), served over HTTP
behind the key with a KV cache, and planned for Azure ML; a sequence classifier answers classify requests."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import types
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import PROJECT, cli
from test_export import assert_no_machine_paths
from toolkit.deploy.export import MANIFEST, ExportError, read_manifest, write_model_folder
from toolkit.deploy.serving.batcher import Batcher
from toolkit.deploy.serving.endpoint import serve
from toolkit.deploy.serving.protocol import GenerateRequest, ScoreRequest
from toolkit.deploy.serving.runtimes import load_runtime

pytestmark = pytest.mark.slow

LLAMA_CONFIG = ("{hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, "
                "num_key_value_heads: 4, vocab_size: 256, max_position_embeddings: 128")
# 100 steps of 16 x 32 bytes at a high learning rate: enough for greedy text that is more than blanks (about 20 s)
LLAMA = ("--set", "model.name=hf", "--set", "model.hf.architecture=llama", "--set",
         f"model.hf.config={LLAMA_CONFIG}}}", "--set", "train.max_steps=100", "--set", "train.batch_size=16",
         "--set", "optim.lr=1e-2", "--set", "train.eval_every=50")
PROMPTS = ("def ", "The return value of", "Return ")
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def exported(finished_runs, tmp_path_factory):
    """The Llama run (shared, never changed) exported through the CLI into a folder of this module's."""
    run = finished_runs(*LLAMA)
    out = tmp_path_factory.mktemp("hf-export") / "model"
    proc = cli("export", str(run.path), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    # save_pretrained imports DeepSpeed (through accelerate): its accelerator guess must not reach the person
    assert "Setting accelerator" not in proc.stdout + proc.stderr, proc.stdout
    return types.SimpleNamespace(run=run, path=out, stdout=proc.stdout)


@pytest.fixture(scope="module")
def endpoint(exported, tmp_path_factory):
    with serve(exported.path, workspace=tmp_path_factory.mktemp("ws"), max_batch=16, max_wait_ms=5) as ep:
        yield ep


def _plain_transformers(script: str, *args: str, cwd: Path) -> list[str]:
    """Run ``script`` in a fresh Python that cannot import Trainbook (no PYTHONPATH, another folder) and has no
    network to the hub; its output is one JSON value per line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _endpoint_greedy(endpoint, prompt: str) -> str:
    status, answer = endpoint.request({"prompt": prompt, "max_new_tokens": NEW_TOKENS, "temperature": 0})
    assert status == 200, answer
    return answer["text"]


# --- the export ------------------------------------------------------------------------------------------------------

def test_a_transformers_run_exports_a_folder_plain_transformers_loads(exported):
    from transformers import AutoModelForCausalLM

    from toolkit.data import corpus as data_mod
    from toolkit.train.models.hf import causal_lm_loss

    files = {p.name for p in exported.path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "model.onnx", "tokenizer.json",
            "parity.json", "config.yaml", MANIFEST} <= files
    assert not [name for name in files if name.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))], "no pickle"
    manifest = read_manifest(exported.path)
    assert (manifest["model"], manifest["task"], manifest["architecture"]) == ("hf", "causal_lm", "llama")
    assert manifest["onnx_opset"] >= 17 and manifest["dynamic_axes"] == ["batch", "sequence"]
    assert "onnx_not_exported" not in manifest and manifest["block_size"] == 128
    assert_no_machine_paths(exported.path / "model.onnx")
    assert (manifest["tokenizer"], manifest["lora"]) == ("bytes-v1", "none")
    assert set(manifest["files"]) == files - {MANIFEST}
    parity = json.loads((exported.path / "parity.json").read_text())
    assert parity["compared"] == ["transformers from_pretrained", "onnxruntime"] and parity["max_abs_diff"] <= 1e-4
    assert [s["shape"] for s in parity["shapes"]] == [[4, 32], [3, 17], [1, 1]]  # the run's block_size, 32
    assert all(s["transformers"] == 0.0 for s in parity["shapes"]), "from_pretrained loads exactly the weights"
    assert "parity        max |torch - transformers from_pretrained| and |torch - onnxruntime|" in exported.stdout

    # the folder holds the trained weights: plain transformers' model has the run's last validation loss
    model = AutoModelForCausalLM.from_pretrained(exported.path).eval()
    cfg = exported.run.read_config()
    corpus = data_mod.load_corpus(cfg)
    with torch.no_grad():
        losses = [causal_lm_loss(model, batch).item() for batch in data_mod.val_batches(corpus, cfg, 0, 1)]
    assert sum(losses) / len(losses) == pytest.approx(exported.run.events("eval")[-1]["val_loss"], abs=1e-5)


PLAIN_GENERATE = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, new_tokens, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder)
for prompt in prompts:
    inputs = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
    print(json.dumps(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)))
"""


def test_plain_transformers_in_a_fresh_process_generates_the_endpoints_greedy_text(exported, endpoint, tmp_path):
    plain = _plain_transformers(PLAIN_GENERATE, str(exported.path), str(NEW_TOKENS), *PROMPTS, cwd=tmp_path)
    assert plain == [_endpoint_greedy(endpoint, prompt) for prompt in PROMPTS]
    assert any(text.strip() for text in plain), "the trained model's words, not only blanks"


def test_a_lora_export_with_its_adapter_kept_separate_loads_and_serves_the_same(exported, tmp_path):
    """LoRA on the exported Llama (model.init_from), exported with model.lora.merge_on_export false: the folder holds
    the base and the adapter side by side; plain transformers (with peft installed) applies the adapter, and the
    endpoint serves the same greedy text."""
    run = tmp_path / "lora"
    proc = cli("train", "tiny", "--run-dir", str(run), *LLAMA[:6], "--set", f"model.init_from={exported.path}",
               "--set", "model.lora.rank=4", "--set", "model.lora.merge_on_export=false", "--set", "train.max_steps=20",
               "--set", "train.eval_every=20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = cli("export", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = run / "model"
    manifest = read_manifest(folder)
    assert manifest["lora"] == "separate" and {"adapter_config.json", "adapter_model.safetensors", "config.json",
                                                "model.safetensors"} <= set(manifest["files"])
    parity = json.loads((folder / "parity.json").read_text())
    assert all(s["transformers"] <= 1e-5 for s in parity["shapes"]), "from_pretrained applies the adapter"
    with serve(folder, workspace=tmp_path / "ws") as endpoint:
        plain = _plain_transformers(PLAIN_GENERATE, str(folder), str(NEW_TOKENS), *PROMPTS, cwd=tmp_path)
        assert plain == [_endpoint_greedy(endpoint, prompt) for prompt in PROMPTS]


# --- serving ---------------------------------------------------------------------------------------------------------

def _details(endpoint) -> dict:
    """What GET /score tells the key's holder: the model, the runtime and the batcher's counters."""
    with urllib.request.urlopen(urllib.request.Request(endpoint.scoring_url, headers=endpoint.headers())) as answer:
        return json.loads(answer.read())


def test_a_transformers_model_is_served_over_http_behind_the_key(endpoint):
    assert endpoint.tasks == ("generate", "score") and endpoint.runtime == "torch"
    ready = _details(endpoint)
    assert (ready["runtime"], ready["model"], ready["kv_cache"], ready["tasks"]) == ("torch", "hf", True,
                                                                                     ["generate", "score"])
    assert ready["tokenizer"] == "bytes", "the byte tokenizer's files are read as bytes (the manifest names it)"
    status, answer = endpoint.request({"prompt": "def "}, headers={"Content-Type": "application/json"})
    assert status == 401 and "Authorization: key missing" in answer["error"]
    for body, message in [
        ({"task": "classify", "text": "x"}, "task: 'classify' is not allowed; allowed: generate, score"),
        ({"prompt": 5}, "prompt: 5 is not allowed"),
        ({"prompt": "def ", "max_new_tokens": 200},
         "max_new_tokens: 200 does not fit the model's context of 128 tokens after a prompt of 4; allowed: up to 124"),
        ({"prompt": "x" * 300}, "prompt: 300 tokens is over the model's context; allowed: up to 127 tokens"),
        ({"prompt": "x", "temperature": -1}, "temperature: -1 is not allowed"),
    ]:
        status, answer = endpoint.request(body)
        assert (status, message in answer.get("error", "")) == (400, True), (body, answer)

    sampled = {"prompt": "def ", "max_new_tokens": 16, "temperature": 0.8, "top_k": 20, "seed": 3}
    status, answer = endpoint.request(sampled)
    assert status == 200 and answer["task"] == "generate" and isinstance(answer["text"], str)
    assert answer["prompt_tokens"] == 4 and 1 <= answer["new_tokens"] <= 16
    assert endpoint.request(sampled)[1]["text"] == answer["text"], "a seed makes sampling repeatable"
    text = "The quick brown fox jumps over the lazy dog. " * 4  # longer than the 128-token context
    status, scored = endpoint.request({"task": "score", "text": text})
    assert status == 200 and scored["predicted_tokens"] == len(text) - 1 and 0 < scored["bits_per_byte"] < 8.5


def test_serve_from_the_command_line_picks_the_kv_caches_runtime(exported, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "toolkit", "serve", str(exported.path), "--workspace",
                             str(tmp_path / "ws")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=PROJECT)
    try:
        first = proc.stdout.readline()  # printed once the endpoint answers
        assert ", torch, model " in first, first
        url = first.split(": ", 1)[1].split(" ")[0]
        key = (tmp_path / "ws" / "endpoints" / "tiny" / "key").read_text()
        request = urllib.request.Request(url, data=json.dumps({"prompt": "def ", "max_new_tokens": 4}).encode(),
                                         headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert json.loads(answer.read())["prompt_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_concurrent_generations_share_forwards_over_the_kv_cache(endpoint):
    before = _details(endpoint)
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda seed: endpoint.request({"prompt": "def ", "max_new_tokens": 16, "seed": seed}),
                                range(12)))
    assert [status for status, _ in results] == [200] * 12
    after = _details(endpoint)
    tokens = sum(answer["new_tokens"] for _, answer in results)
    forwards, rows = after["forwards"] - before["forwards"], after["rows"] - before["rows"]
    assert rows == tokens and forwards < tokens / 2, f"{forwards} forwards for {tokens} tokens: not batched"


def test_the_kv_cache_and_batching_change_speed_not_answers(exported):
    """Greedy generations of prompts of different lengths submitted together: the same text with the KV cache
    (rows joining and leaving one left-padded cache) as recomputing the context for every token, batched or one at
    a time, on torch or ONNX Runtime."""
    prompts = [b"def ", b"The return value of", b"x", b"class Foo:\n    def __init__(self"]
    requests = [GenerateRequest(p, 12, 0.0, 0, None) for p in prompts] + [ScoreRequest(b"import os\nimport sys\n" * 3)]
    answers, forwards = {}, {}
    for runtime in ("torch", "onnx"):
        for kv_cache in (True, False):
            for max_batch in (1, 8):
                batcher = Batcher(load_runtime(exported.path, runtime), max_batch=max_batch, max_wait_ms=50,
                                  kv_cache=kv_cache)
                assert (batcher.decoder is not None) == (runtime == "torch" and kv_cache)
                futures = [batcher.submit(r) for r in requests]
                answers[runtime, kv_cache, max_batch] = [f.result(timeout=120) for f in futures]
                forwards[runtime, kv_cache, max_batch] = batcher.stats["forwards"]
    reference = answers["torch", False, 1]
    for key, got in answers.items():
        assert [a["text"] for a in got[:4]] == [a["text"] for a in reference[:4]], key
        assert got[4]["log_likelihood"] == pytest.approx(reference[4]["log_likelihood"], abs=1e-3), key
    assert forwards["torch", True, 8] < forwards["torch", True, 1], "the cached rows shared forwards"


# --- a sequence classifier -------------------------------------------------------------------------------------------

GOOD, BAD = ["good", "great", "lovely", "fine"], ["bad", "awful", "poor", "ugly"]
NOUNS = ["soup", "film", "room", "book", "train", "song"]


def _reviews(count: int) -> list[dict]:
    """Labelled texts whose class only their first word says: "great film, review 12" is pos."""
    rng = random.Random(7)
    rows = []
    for i in range(count):
        label = rng.choice(["pos", "neg"])
        rows.append({"text": f"{rng.choice(GOOD if label == 'pos' else BAD)} {rng.choice(NOUNS)}, review {i}",
                     "label": label})
    return rows


def test_a_classifier_trained_on_labelled_text_exports_and_answers_classify_requests(tmp_path):
    data = tmp_path / "reviews.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _reviews(300)))
    run = tmp_path / "classifier"
    proc = cli("train", "tiny", "--run-dir", str(run), *LLAMA[:4], "--set", f"model.hf.config={LLAMA_CONFIG}}}",
               "--set", "model.hf.task=sequence_classification", "--set", f"data.path={data}", "--set",
               "optim.lr=0.01", "--set", "train.max_steps=40")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = cli("export", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = read_manifest(run / "model")
    assert (manifest["task"], manifest["labels"]) == ("sequence_classification", ["neg", "pos"]), \
        "the class names of the data, in config.json's id2label too"
    assert manifest["onnx_opset"] >= 17, "a classifier with a padding id exports to ONNX"

    texts = ["lovely song, review 9001", "awful train, review 9002", "great book, review 9003", "poor soup, review 1"]
    answers = {}
    for runtime in ("torch", "onnx"):
        with serve(run / "model", runtime=runtime, workspace=tmp_path / "ws", max_batch=8) as endpoint:
            assert endpoint.tasks == ("classify",)
            with ThreadPoolExecutor(len(texts)) as pool:  # at once: they share the batcher
                answers[runtime] = list(pool.map(lambda text: endpoint.request({"task": "classify", "text": text}),
                                                 texts))
            if runtime == "torch":
                assert endpoint.request({"text": "lovely"})[1]["task"] == "classify", "a classifier's default task"
                for body, message in [
                    ({"task": "generate", "prompt": "x"}, "task: 'generate' is not allowed; allowed: classify"),
                    ({"task": "classify"}, "text: None is not allowed"),
                    ({"text": "x" * 200}, "text: 200 tokens is not allowed; allowed: 1 to 128 tokens")]:
                    status, answer = endpoint.request(body)
                    assert (status, message in answer["error"]) == (400, True), (body, answer)
                assert endpoint.request({"text": "x"}, headers={"Content-Type": "application/json"})[0] == 401
    for text, (status, answer) in zip(texts, answers["torch"]):
        assert status == 200 and answer["task"] == "classify", answer
        assert answer["label"] == ("pos" if text.split()[0] in GOOD else "neg"), (text, answer)
        assert answer["label_id"] == ["neg", "pos"].index(answer["label"])
        assert list(answer["probabilities"]) == ["neg", "pos"]
        assert sum(answer["probabilities"].values()) == pytest.approx(1.0)
    for (_, served), (_, onnx) in zip(answers["torch"], answers["onnx"]):
        assert onnx["label"] == served["label"]
        assert onnx["probabilities"] == pytest.approx(served["probabilities"], abs=1e-4)


def test_an_architecture_onnx_cannot_export_exports_without_it_and_says_why(tmp_path):
    """transformers' decoder-only classifiers refuse batches of more than one row without a padding id, so ONNX
    cannot export the dynamic batch of one built without (here from its config, outside a run): the export still
    succeeds, the manifest and parity.json say why, and the ONNX runtime is refused naming it."""
    from toolkit import config as config_mod
    from toolkit.train.models import build_model

    cfg = config_mod.load("tiny", ["model.name=hf", "model.hf.architecture=llama",
                                   "model.hf.task=sequence_classification", f"model.hf.config={LLAMA_CONFIG}}}",
                                   f"data.path={tmp_path / 'unused.jsonl'}"])
    torch.manual_seed(0)
    provenance = {"run_dir": str(tmp_path), "checkpoint": "built-in-test", "step": 0, "engine": "torch",
                  "zero_stage": 0, "data": {}}
    result = write_model_folder(build_model(cfg.model).eval(), cfg, tmp_path / "model", provenance)
    why = result.manifest["onnx_not_exported"]
    assert result.manifest["onnx_opset"] is None and "padding token" in why
    assert not (result.path / "model.onnx").exists() and result.parity_ok
    assert json.loads((result.path / "parity.json").read_text())["onnx"] == f"not exported: {why}"
    assert "not exported (torch.onnx.export failed" in result.summary()
    with pytest.raises(ExportError, match=r"has no model.onnx, which --runtime onnx loads \(the export could not "
                                          r"write it: torch.onnx.export failed: .*padding token"):
        serve(result.path, runtime="onnx", workspace=tmp_path / "ws")
    with serve(result.path, workspace=tmp_path / "ws", max_batch=8) as endpoint:  # torch: rows one by one
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda t: endpoint.request({"text": t}), ["one", "two", "six", "a longer one"]))
    assert [status for status, _ in answers] == [200] * 4
    assert all(answer["label"] in ("LABEL_0", "LABEL_1") for _, answer in answers)


# --- the Azure ML deployment plan --------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::marshmallow.warnings.Marshmallow4Warning")
def test_the_azure_deployment_plan_of_a_transformers_model_loads_with_azure_ai_ml(exported, tmp_path):
    from azure.ai.ml import load_online_deployment, load_online_endpoint

    from toolkit.azure.deploy_plan import build_deployment_plan, write_deployment_plan

    plan = build_deployment_plan(exported.path, endpoint="tb-llama", sku="Standard_DS3_v2")
    out = write_deployment_plan(plan, tmp_path / "plan")
    assert load_online_endpoint(out / "endpoint.yaml").name == "tb-llama"
    deployment = load_online_deployment(out / "deployment.yaml")
    assert deployment.environment_variables["TRAINBOOK_RUNTIME"] == "torch", "the KV cache's runtime by default"
    assert Path(deployment.model.path) == exported.path and deployment.model.name == "tiny"
    assert deployment.code_configuration.scoring_script == "toolkit/deploy/serving/score.py"
    assert "runtime      torch (model.safetensors)" in plan.summary()
    onnx = build_deployment_plan(exported.path, endpoint="tb-llama", sku="Standard_DS3_v2", runtime="onnx")
    assert onnx.deployment.environment_variables["TRAINBOOK_RUNTIME"] == "onnx"
